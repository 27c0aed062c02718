"""Operator changes to the steps of a job no worker holds: skipping a step, and
seeding the steps of a retry that starts from a chosen step (see
``jobstate.workflows.operators``). Status changes go through ``services.move_step``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobstate.exceptions import InvalidTransition, StepStateError
from jobstate.models import Job, JobStep
from jobstate.models.step import StepStatus
from jobstate.services.actors import Actor
from jobstate.services.steps import move_step, step_event
from jobstate.states import TERMINAL, Status
from jobstate.storable import text
from jobstate.workflows.steps import COMPENSATING, COMPENSATION_KEYS, _ensure_rows

S = StepStatus


def _lock_job(pk: Any) -> Job:
    return Job.objects.select_for_update().get(pk=pk)


def skip(job: Job | Any, names: list[str], name: str, *, actor: Actor, reason: str) -> None:
    """An operator skips a failed or pending step of a queued or waiting job."""
    pk = job.pk if isinstance(job, Job) else job
    now = timezone.now()
    with transaction.atomic():
        locked = _lock_job(pk)
        if locked.status not in (Status.QUEUED, Status.WAITING):
            raise InvalidTransition(locked.status, Status.QUEUED, "skip_step")
        _ensure_rows(locked.pk, names)
        row = JobStep.objects.select_for_update().get(job_id=pk, name=name)
        if JobStep.objects.filter(job_id=pk, detail__has_key=COMPENSATING).exists():
            raise StepStateError(
                pk, name, "skip it (the workflow failed for good and is compensating)", row.status
            )
        detail = {**row.detail, "skipped_by": text(actor.label), "skip_reason": text(reason[:1000])}
        move_step(
            pk,
            name,
            "skip",
            actor=actor,
            job_status=locked.status,
            fields={"detail": detail, "finished_at": now},
            reason=reason,
            requested="skip it (only a failed or pending step can be skipped)",
            now=now,
        )


def seed_retry(
    new: Job,
    old_id: Any,
    old_rows: dict[str, JobStep],
    names: list[str],
    start: str | None,
    skip_names: Iterable[str],
    *,
    actor: Actor,
    reason: str,
) -> None:
    """Step rows of a retry that starts at ``start`` (None: after the last step):
    earlier steps copied as they ended (their outputs are reused), ``skip_names``
    skipped, the rest pending."""
    now = timezone.now()
    skipping = set(skip_names)
    first = len(names) if start is None else names.index(start)
    rows: list[JobStep] = []
    for position, name in enumerate(names):
        if position < first:
            old = old_rows[name]
            rows.append(
                JobStep(
                    job_id=new.pk,
                    name=name,
                    position=position,
                    status=old.status,
                    attempts=old.attempts,
                    output=old.output,
                    detail={**_bookkeeping(old.detail), "copied_from": str(old.job_id)},
                    started_at=old.started_at,
                    finished_at=old.finished_at,
                    updated_at=now,
                )
            )
        elif name in skipping:
            rows.append(
                JobStep(
                    job_id=new.pk,
                    name=name,
                    position=position,
                    status=S.SKIPPED,
                    detail={"skipped_by": text(actor.label), "skip_reason": text(reason[:1000])},
                    finished_at=now,
                    updated_at=now,
                )
            )
        else:
            rows.append(JobStep(job_id=new.pk, name=name, position=position, updated_at=now))
    with transaction.atomic():
        if _lock_job(new.pk).status in TERMINAL:
            raise InvalidTransition(new.status, Status.QUEUED, "retry_from")
        JobStep.objects.bulk_create(rows)
        step_event(
            new.pk,
            Status.QUEUED,
            "retry_from",
            actor,
            reason,
            {
                "retry_of": str(old_id),
                "from_step": start,
                "reused": names[:first],
                "skipped": [n for n in names if n in skipping],
            },
            now,
        )


def _bookkeeping(detail: dict[str, Any]) -> dict[str, Any]:
    """A copied step's detail, without the old job's compensation (its undo was not run for the retry)."""
    return {k: v for k, v in detail.items() if k not in COMPENSATION_KEYS}
