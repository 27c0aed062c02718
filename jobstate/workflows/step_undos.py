"""Compensation's marks on a workflow's ``JobStep`` rows: a step's undo ran
(``undone``) or raised (``undo_failed``), and compensation ended
(``compensated``); and the history row of a run whose undos a cancel starts
(``undoing_cancel``). Each write holds the job's lease (``step_lease``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobstate.models import Job, JobStep
from jobstate.services.recovery_runs import mark_cancel_undos
from jobstate.services.steps import move_step, step_event
from jobstate.states import Status
from jobstate.workflows.step_lease import actor_of, hold
from jobstate.workflows.steps import UNDO_ERROR


def undone(job: Job, token: Any, name: str, *, because: str) -> None:
    """Compensation: the step's undo ran; ``completed`` -> ``undone``."""
    now = timezone.now()
    with transaction.atomic():
        hold(job, token, message=f"undid {name}", step=name, cancel_ok=True)
        row = JobStep.objects.select_for_update().filter(job_id=job.pk, name=name).first()
        detail = {
            **(row.detail if row else {}),
            "undone_at": now.isoformat(),
            "undone_because": because[:1000],
        }
        move_step(
            job.pk,
            name,
            "undo",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields={"detail": detail},
            reason=f"compensating: {because}",
            requested="mark it undone",
            now=now,
        )


def undo_failed(job: Job, token: Any, name: str, error: str, *, because: str) -> None:
    """Compensation: the step's undo raised; the step stays ``completed``, the error is kept."""
    now = timezone.now()
    with transaction.atomic():
        hold(job, token, step=name, cancel_ok=True)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        detail = {**row.detail, UNDO_ERROR: error[:2000]}
        JobStep.objects.filter(pk=row.pk).update(detail=detail, updated_at=now)
        step_event(
            job.pk,
            Status.PROCESSING,
            "step_undo_failed",
            actor_of(job),
            f"compensating: {because}",
            {"step": name, "error": error[:2000]},
            now,
        )


def compensated(job: Job, token: Any, failed_step: str, message: str) -> None:
    """Compensation ended: the job's current step is the step that failed for good
    again, its progress message what was undone (the job then fails with the error)."""
    with transaction.atomic():
        hold(job, token, message=message, step=failed_step, cancel_ok=True)


def undoing_cancel(job: Job, token: Any) -> None:
    """``undo_on_cancel``: a cancel stopped the run and its undos run now. Unless the run
    began for them (marked already), it is marked as one that honours the cancel
    (``recovery_runs.mark_cancel_undos``) before the first undo, so a long undo is not
    a "cancel not honoured"."""
    with transaction.atomic():
        hold(job, token, cancel_ok=True)
        mark_cancel_undos(job.pk, actor_of(job), timezone.now())
