"""What workflows do to their ``JobStep`` rows.

Every change a worker makes to a step happens in one transaction with a lease
check on its job: ``services.report_progress`` (or ``services.heartbeat``) is a
token-guarded UPDATE of the job row, so a worker that lost its lease writes
nothing, and on PostgreSQL the row stays locked until the step change commits,
so the reaper cannot take the job half-way. Status changes go through
``services.move_step`` (the declared ``JobStep`` transitions, a guarded UPDATE and
a history row on the job); this module writes the steps' other columns (rows
created pending, cursors, bookkeeping in ``detail``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import CancelRequested, StepStateError
from jobstate.models import Job, JobStep
from jobstate.models.step import RUNNABLE, StepStatus
from jobstate.services.actors import Actor
from jobstate.services.steps import move_step, step_event
from jobstate.states import Status
from jobstate.storable import json_value, result_value, text
from jobstate.workflows import spawns
from jobstate.workflows.spawns import CHUNK, REUSED, SPAWNED, ChildSpec, Reuse

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


def _refused(job_id: Any, name: str, requested: str) -> StepStateError:
    row = JobStep.objects.filter(job_id=job_id, name=name).values_list("status", flat=True).first()
    return StepStateError(job_id, name, requested, row)


def _hold(
    job: Job,
    token: Any,
    *,
    percent: float | None = None,
    message: str | None = None,
    step: str | None = None,
    cancel_ok: bool = False,
) -> bool:
    """Prove (inside the caller's transaction) that ``token`` still owns ``job``,
    renewing its lease and moving its progress. Raises ``LeaseLost``, or
    ``CancelRequested`` unless ``cancel_ok`` (finishing a step that already ran);
    returns whether a cancel is pending."""
    if percent is not None:
        percent = min(100.0, max(0.0, float(percent)))
    try:
        services.report_progress(job, token, percent, message, step=step)
    except CancelRequested:
        if not cancel_ok:
            raise
        services.heartbeat(job, token)
        return True
    return False


def _worker(job: Job) -> Actor:
    return Actor.worker(job.worker_id or "?")


def ensure(job: Job, token: Any, names: Iterable[str], *, cancel_ok: bool = False) -> dict[str, JobStep]:
    """The job's step rows by name, creating missing ones ``pending`` (first run).
    Raises ``CancelRequested`` on a pending cancel unless ``cancel_ok``."""
    with transaction.atomic():
        _hold(job, token, cancel_ok=cancel_ok)
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


def begin(job: Job, token: Any, row: JobStep, *, percent: float) -> JobStep:
    """``pending``/``failed``/``running`` (a crashed run) -> ``running``, one more attempt.
    The cursor is kept, so the step resumes from its last checkpoint. ``row`` (read
    at the start of the run: only the lease holder changes it) is updated in place."""
    now = timezone.now()
    with transaction.atomic():
        _hold(job, token, percent=percent, message="", step=row.name)
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
            actor=_worker(job),
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
        _hold(job, token, percent=percent, message=message, step=name)
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
        _hold(job, token, percent=percent, step=row.name, cancel_ok=True)
        move_step(
            job.pk,
            row.name,
            "complete",
            actor=_worker(job),
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
        cancelling = _hold(job, token, step=row.name, cancel_ok=True)
        compensating = compensating and not cancelling
        detail = JobStep.objects.select_for_update().values_list("detail", flat=True).get(pk=row.pk)
        if compensating:
            detail = {**detail, COMPENSATING: {"error": error[:2000], "at": now.isoformat()}}
        move_step(
            job.pk,
            row.name,
            "fail" if started else "lose",
            actor=_worker(job),
            job_status=Status.PROCESSING,
            fields={"error_message": error, "output": output, "detail": detail, "finished_at": now},
            reason=error,
            metadata={"attempt": row.attempts, "error": error[:2000], "final": compensating},
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
        _hold(job, token, step=name, cancel_ok=True)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        merged = {k: v for k, v in {**row.detail, **detail}.items() if not (k in detail and v is None)}
        JobStep.objects.filter(pk=row.pk).update(detail=merged, updated_at=timezone.now())


def wait(
    job: Job,
    token: Any,
    name: str,
    children: list[ChildSpec],
    *,
    value: Any,
    band: tuple[float, float],
    reuse: Reuse | None = None,
) -> list[Job]:
    """Start the step's child jobs and mark it ``waiting``, all in one transaction:
    either every child exists and the step waits for them, or nothing happened.
    ``reuse``: the earlier run's completed children some of them take instead, and
    those that did not complete which the new ones retry (``retry_of``)
    (``jobstate.workflows.reuse``); the step's ``detail`` and history name them."""
    value = result_value(value, "output")
    picks = reuse.picks if reuse is not None and reuse.picks else (None,) * len(children)
    retries = reuse.retries if reuse is not None and reuse.retries else (None,) * len(children)
    now = timezone.now()
    with transaction.atomic():
        _hold(job, token, percent=band[0], message=f"waiting for {len(children)} child jobs", step=name)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        if row.status != S.RUNNING:  # checked before its children are created
            raise StepStateError(job.pk, name, "wait in it", row.status)
        earlier = _retried(reuse)
        new: list[services.Child] = []
        for child, pick, old in zip(children, picks, retries, strict=True):
            if pick is None:
                retry_of = earlier.get(old) if old is not None else None
                reason = f"child of step '{name}'" + (f", retry of {old}" if retry_of else "")
                new.append(
                    services.Child(
                        child.kind, child.parameters, retry_of=retry_of, reason=reason, **child.options
                    )
                )
        created = services.enqueue_children(job, new, actor=_worker(job))
        made = iter(created)
        ids = [pick or str(next(made).pk) for pick in picks]
        reuse = reuse or Reuse()
        if SPAWNED in row.detail:
            spawns.drop(job.pk, name)
        detail = {k: v for k, v in row.detail.items() if k not in (REUSED, SPAWNED)}
        detail.update(children=ids, total=len(ids), value=value, band=list(band), **reuse.note())
        metadata: dict[str, Any] = {"children": len(ids)}
        reason = ""
        if reuse.jobs:
            metadata.update(reused=len(reuse.jobs), reused_from=reuse.source)
            reason = f"reused {len(reuse.jobs)} completed child jobs of {reuse.source}"
        if earlier:
            metadata.update(retries=len(earlier), retries_from=reuse.source)
        move_step(
            job.pk,
            name,
            "wait",
            actor=_worker(job),
            job_status=Status.PROCESSING,
            fields={"detail": detail},
            reason=reason,
            metadata=metadata,
            requested="wait in it",
            now=now,
        )
    return created


def _retried(reuse: Reuse | None) -> dict[str, Job]:
    """The earlier children the new ones retry, by id, each locked as ``services.retry``
    locks the job it retries. One deleted meanwhile, or retried by someone else since
    the plan (a job is retried once), is left out: its spawn starts a child that
    retries none."""
    ids = sorted(reuse.retried) if reuse is not None else []
    found: dict[str, Job] = {}
    for i in range(0, len(ids), CHUNK):
        chunk = [uuid.UUID(pk) for pk in ids[i : i + CHUNK]]
        locked = Job.objects.select_for_update(no_key=True).filter(pk__in=chunk).order_by("pk")
        found.update((str(old.pk), old) for old in locked)
        taken = Job.objects.filter(retry_of_id__in=chunk).values_list("retry_of_id", flat=True)
        for pk in taken:
            found.pop(str(pk), None)
    return found


def resume_wait(job: Job, token: Any, row: JobStep, *, percent: float) -> None:
    """A fan-out step whose children an earlier run of this job started (that run then
    failed, say, while fanning in): ``waiting`` again for the same children, so a
    retry never starts them twice."""
    now = timezone.now()
    with transaction.atomic():
        _hold(job, token, percent=percent, message="waiting for child jobs", step=row.name)
        move_step(
            job.pk,
            row.name,
            "resume_wait",
            actor=_worker(job),
            job_status=Status.PROCESSING,
            fields={"attempts": F("attempts") + 1, "finished_at": None, "error_message": ""},
            metadata={"children": len(row.detail.get("children", [])), "resumed": True},
            requested="wait in it again",
            now=now,
        )
    row.status, row.attempts, row.finished_at, row.error_message = S.WAITING, row.attempts + 1, None, ""


def serving(job: Job, token: Any, name: str, message: str) -> None:
    """A service-style step is up: ``running`` -> ``serving``, the message shown on the job."""
    with transaction.atomic():
        _hold(job, token, message=message, step=name)
        move_step(
            job.pk,
            name,
            "serve",
            actor=_worker(job),
            job_status=Status.PROCESSING,
            metadata={"message": message[:500]},
            requested="serve",
        )


def undone(job: Job, token: Any, name: str, *, because: str) -> None:
    """Compensation: the step's undo ran; ``completed`` -> ``undone``."""
    now = timezone.now()
    with transaction.atomic():
        _hold(job, token, message=f"undid {name}", step=name, cancel_ok=True)
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
            actor=_worker(job),
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
        _hold(job, token, step=name, cancel_ok=True)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        detail = {**row.detail, UNDO_ERROR: error[:2000]}
        JobStep.objects.filter(pk=row.pk).update(detail=detail, updated_at=now)
        step_event(
            job.pk,
            Status.PROCESSING,
            "step_undo_failed",
            _worker(job),
            f"compensating: {because}",
            {"step": name, "error": error[:2000]},
            now,
        )


def compensated(job: Job, token: Any, failed_step: str, message: str) -> None:
    """Compensation ended: the job's current step is the step that failed for good
    again, its progress message what was undone (the job then fails with the error)."""
    with transaction.atomic():
        _hold(job, token, message=message, step=failed_step, cancel_ok=True)


def children_of(job_id: Any, name: str) -> list[str]:
    """Ids of the child jobs step ``name`` started, in start order."""
    detail = JobStep.objects.filter(job_id=job_id, name=name).values_list("detail", flat=True).first()
    return list((detail or {}).get("children", []))
