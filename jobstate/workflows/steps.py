"""What a workflow's run does to its ``JobStep`` rows: it creates them pending,
starts, checkpoints, completes or fails its steps and notes their bookkeeping;
the reaper marks the step where a worker was lost (``lost``). A fan-out step's
waits on its children are in ``step_waits``, compensation's marks in
``step_undos``; every write a worker makes holds its job's lease
(``step_lease``). Status changes go through ``services.move_step`` (the
declared ``JobStep`` transitions, a guarded UPDATE and a history row on the
job); these modules write the steps' other columns (rows created pending,
cursors, bookkeeping in ``detail``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobstate.exceptions import StepStateError
from jobstate.models import Job, JobStep
from jobstate.models.step import RUNNABLE, StepStatus
from jobstate.services.actors import Actor
from jobstate.services.steps import move_step
from jobstate.states import Status
from jobstate.storable import json_value, result_value, text
from jobstate.workflows import spawns
from jobstate.workflows.spawns import ChildSpec
from jobstate.workflows.step_lease import actor_of, hold

__all__ = ["RUNNABLE", "ChildSpec", "StepStateError"]  # StepStateError lives in jobstate.exceptions

S = StepStatus
IN_PROGRESS = (S.RUNNING, S.SERVING)
# Keys of ``JobStep.detail``. COMPENSATING, on the step that failed for good, says
# the workflow is being compensated: every later run only finishes the undos.
COMPENSATING = "compensating"
UNDO_ERROR = "undo_error"
COMPENSATION_KEYS = (COMPENSATING, UNDO_ERROR, "undone_at", "undone_because")
# The step's partial notes: PARTIAL its body's (``ctx.mark_partial``), FAN_IN_PARTIAL
# its fan-in's (children that did not complete).
PARTIAL = "partial"
FAN_IN_PARTIAL = "fan_in_partial"
# The step's own progress (0..100) at its last checkpoint that gave one: a resumed
# run begins there, not at the start of the step's share of the job's progress.
PERCENT = "percent"
# The job's progress message as a step resumes from its checkpoint: what it reported
# after that checkpoint is behind it (that work runs again), so its progress went back.
RESUMED = "resumed from its last checkpoint"


def _refused(job_id: Any, name: str, requested: str) -> StepStateError:
    row = JobStep.objects.filter(job_id=job_id, name=name).values_list("status", flat=True).first()
    return StepStateError(job_id, name, requested, row)


def ensure(job: Job, token: Any, names: Iterable[str], *, cancel_ok: bool = False) -> dict[str, JobStep]:
    """The job's step rows by name, creating missing ones ``pending`` (first run).
    Raises ``CancelRequested`` on a pending cancel unless ``cancel_ok``."""
    with transaction.atomic():
        hold(job, token, cancel_ok=cancel_ok)
        return _ensure_rows(job.pk, names)


def _ensure_rows(job_id: Any, names: Iterable[str]) -> dict[str, JobStep]:
    rows = {row.name: row for row in JobStep.objects.filter(job_id=job_id)}
    missing = [n for n in names if n not in rows]
    if missing:
        start = max((r.position for r in rows.values()), default=-1) + 1
        now = timezone.now()
        created = JobStep.objects.bulk_create(
            [
                JobStep(job_id=job_id, name=n, position=start + i, updated_at=now)
                for i, n in enumerate(missing)
            ]
        )
        rows.update({row.name: row for row in created})
    return rows


def resumed_percent(row: JobStep) -> float:
    """The step's own progress (0..100) when it begins: 0, or where the checkpoint it
    resumes from left it."""
    stored = (row.detail or {}).get(PERCENT) if row.cursor is not None else None
    if isinstance(stored, bool) or not isinstance(stored, int | float):
        return 0.0
    return min(100.0, max(0.0, float(stored)))


def begin(job: Job, token: Any, row: JobStep, *, percent: float) -> JobStep:
    """``pending``/``failed``/``running`` (a crashed run) -> ``running``, one more attempt.
    The cursor is kept, so the step resumes from its last checkpoint (the job's message
    says so: ``RESUMED``). ``row`` (read at the start of the run: only the lease holder
    changes it) is updated in place."""
    now = timezone.now()
    with transaction.atomic():
        hold(job, token, percent=percent, message=RESUMED if row.cursor is not None else "", step=row.name)
        fields = {
            "attempts": F("attempts") + 1,
            "started_at": Coalesce(F("started_at"), now),
            "finished_at": None,
            "error_message": "",
        }
        move_step(
            job.pk,
            row.name,
            "start",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields=fields,
            metadata={"attempt": row.attempts + 1},
            requested="start it",
            now=now,
        )
    row.status, row.attempts, row.started_at = S.RUNNING, row.attempts + 1, row.started_at or now
    row.finished_at, row.error_message, row.updated_at = None, "", now
    return row


def checkpoint(
    job: Job,
    token: Any,
    name: str,
    cursor: Any,
    *,
    percent: float | None = None,
    message: str | None = None,
    detail: dict[str, Any] | None = None,
    spawned: spawns.Stored | None = None,
) -> None:
    """Store the running step's cursor (any JSON) atomically with a lease check, and
    merge ``detail`` (bookkeeping that goes with it) into the step's in the same write;
    ``spawned``: its iteration's spawns stored with it (``workflows.spawns``)."""
    cursor = json_value(cursor, "cursor")
    extra = json_value(detail, "detail") if detail else {}
    if spawned is not None:
        extra.update(spawned.entry())
    with transaction.atomic():
        hold(job, token, percent=percent, message=message, step=name)
        rows = JobStep.objects.filter(job_id=job.pk, name=name, status__in=IN_PROGRESS)
        fields: dict[str, Any] = {"cursor": cursor, "updated_at": timezone.now()}
        if extra:
            held = list(rows.order_by().select_for_update().values_list("detail", flat=True))
            fields["detail"] = {**(held[0] if held else {}), **extra}
        if not rows.update(**fields):
            raise _refused(job.pk, name, "checkpoint it")
        if spawned is not None:
            spawns.save(job.pk, name, spawned)


def complete(job: Job, token: Any, row: JobStep, output: Any, *, percent: float) -> None:
    """``running``/``serving``/``waiting`` -> ``completed`` with its output."""
    output = result_value(output, "output")
    now = timezone.now()
    with transaction.atomic():
        hold(job, token, percent=percent, step=row.name, cancel_ok=True)
        move_step(
            job.pk,
            row.name,
            "complete",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields={"output": output, "finished_at": now, "error_message": ""},
            metadata={"attempt": row.attempts},
            requested="complete it",
            now=now,
        )
    row.status, row.output, row.finished_at, row.updated_at = S.COMPLETED, output, now, now


def fail(
    job: Job,
    token: Any,
    row: JobStep,
    error: str,
    *,
    output: Any = None,
    compensating: bool = False,
    started: bool = True,
) -> bool:
    """The step raised: ``failed`` with the error (a retry resumes it from its cursor).
    ``compensating``: the workflow failed for good; from this commit on, every run of
    the job only finishes the undos (see ``jobstate.workflows.compensation``), unless
    a cancel is pending (a cancel is no failure and runs no undo: the job ends
    cancelled). Returns whether it marked the workflow compensating. ``started=False``:
    the step had not started (pending, or failed by an earlier attempt)."""
    output = result_value(output, "output")
    now = timezone.now()
    error = text((error or "failed")[:10000])
    with transaction.atomic():
        cancelling = hold(job, token, step=row.name, cancel_ok=True)
        compensating = compensating and not cancelling
        detail = JobStep.objects.select_for_update().values_list("detail", flat=True).get(pk=row.pk)
        if compensating:
            detail = {**detail, COMPENSATING: {"error": error[:2000], "at": now.isoformat()}}
        move_step(
            job.pk,
            row.name,
            "fail" if started else "lose",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields={"error_message": error, "output": output, "detail": detail, "finished_at": now},
            reason=error,
            metadata={
                "attempt": row.attempts,
                "error": error[:2000],
                "final": compensating,
                # The rest of this run compensates, which a cancel does not stop (``recovering``).
                **({"recovery": "compensate"} if compensating else {}),
            },
            requested="fail it",
            now=now,
        )
    row.status, row.error_message, row.output, row.finished_at = S.FAILED, error, output, now
    row.detail = detail
    return compensating


def lost(
    job_id: Any, name: str, error: str, *, actor: Actor, now: datetime, names: Iterable[str] = ()
) -> None:
    """The reaper, in the transaction that requeued the job (its lease had expired on
    the last attempt): step ``name``, where the worker was lost (or the next one to
    run), fails for good and the job's next run compensates. ``names``: the
    workflow's steps, whose missing rows are made first (a step a deploy added
    after the job's last run has none yet)."""
    error = text(error)
    _ensure_rows(job_id, dict.fromkeys([*names, name]))
    row = JobStep.objects.select_for_update().get(job_id=job_id, name=name)
    detail = {**row.detail, COMPENSATING: {"error": error[:2000], "at": now.isoformat()}}
    move_step(
        job_id,
        name,
        "lose",
        actor=actor,
        job_status=Status.QUEUED,
        fields={"error_message": error, "detail": detail, "finished_at": now},
        reason=error,
        metadata={"attempt": row.attempts, "error": error[:2000], "final": True},
        now=now,
    )


def partial_notes(detail: dict[str, Any]) -> list[str]:
    """The step's partial notes, its body's then its fan-in's."""
    return [str(n) for n in (detail.get(PARTIAL), detail.get(FAN_IN_PARTIAL)) if n]


def note(job: Job, token: Any, name: str, **detail: Any) -> None:
    """Merge ``detail`` into the running step's bookkeeping (e.g. a partial note);
    a key given None is removed."""
    detail = json_value(detail, "detail")
    with transaction.atomic():
        hold(job, token, step=name, cancel_ok=True)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        merged = {k: v for k, v in {**row.detail, **detail}.items() if not (k in detail and v is None)}
        JobStep.objects.filter(pk=row.pk).update(detail=merged, updated_at=timezone.now())


def serving(job: Job, token: Any, name: str, message: str) -> None:
    """A service-style step is up: ``running`` -> ``serving``, the message shown on the job."""
    with transaction.atomic():
        hold(job, token, message=message, step=name)
        move_step(
            job.pk,
            name,
            "serve",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            metadata={"message": message[:500]},
            requested="serve",
        )
