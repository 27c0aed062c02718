"""Persisting state changes: one conditional UPDATE plus one JobEvent, atomically.

The allowed moves come from the ``@transition`` declarations on ``Job``; the
UPDATE's ``WHERE status IN (sources)`` makes the database, not Python, the
final judge, so two racing callers can never both win.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job, JobEvent, JobStep
from jobstate.services.actors import Actor
from jobstate.signals import job_transitioned
from jobstate.states import ACTIVE, TERMINAL, Status

logger = logging.getLogger("jobstate")

# Far-future run_after for a parent that waits for its children: it is woken,
# in the transaction that finishes its last child, by setting run_after to now.
WAITING = datetime(2999, 1, 1, tzinfo=UTC)


def _meta(name: str) -> Any:
    method = getattr(Job, name, None)
    meta = getattr(method, "_django_fsm", None)
    if meta is None:
        raise ValueError(f"'{name}' is not a Job transition")
    return meta


def sources_of(name: str) -> tuple[str, ...]:
    return tuple(str(s) for s in _meta(name).transitions)


def target_of(name: str) -> str:
    targets = {t.target for t in _meta(name).transitions.values()}
    (target,) = targets
    return str(target)


def all_transitions() -> list[tuple[str, str, str]]:
    """(source, target, name) for every declared transition, in declaration order."""
    field = Job._meta.get_field("status")
    return [
        (str(t.source), str(t.target), t.name)
        for t in field.get_all_transitions(Job)  # type: ignore[attr-defined]
    ]


def allowed_transitions(status: str) -> list[str]:
    return [name for source, _target, name in all_transitions() if source == status]


def record_event(
    job_id: Any,
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str = "",
    metadata: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> JobEvent:
    event = JobEvent.objects.create(
        job_id=job_id,
        from_status=from_status,
        to_status=to_status,
        transition=name,
        actor_id=actor.user_id,
        actor_label=actor.label,
        reason=reason or "",
        metadata=metadata or {},
        created_at=now or timezone.now(),
    )
    announce(job_id, from_status, to_status, name, actor, reason)
    return event


def announce(
    job_id: Any, from_status: str, to_status: str, name: str, actor: Actor, reason: str = ""
) -> None:
    """Send ``job_transitioned`` once the surrounding transaction commits."""
    if not job_transitioned.has_listeners(Job):
        return

    def send() -> None:
        job_transitioned.send(
            sender=Job,
            job_id=job_id,
            from_status=from_status,
            to_status=to_status,
            transition=name,
            actor_label=actor.label,
            reason=reason,
        )

    transaction.on_commit(send)


def move(
    job: Job | UUID | str,
    name: str,
    *,
    actor: Actor,
    token: UUID | str | None = None,
    reason: str = "",
    fields: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    condition: Q | None = None,
    now: datetime | None = None,
) -> Job | None:
    """Apply transition ``name`` to ``job`` and record it; raise if refused.

    ``token`` (when given) must match the job's lease token, ``condition`` is an
    extra guard on the row. A refused move raises ``InvalidTransition`` or
    ``LeaseLost`` and writes nothing. Returns the in-memory job, updated, when
    one was passed.
    """
    now = now or timezone.now()
    target = target_of(name)
    sources = sources_of(name)
    job_id = job.pk if isinstance(job, Job) else job
    values: dict[str, Any] = {"status": target, "updated_at": now, **(fields or {})}
    if target in TERMINAL:
        values.setdefault("finished_at", now)
    if target != Status.PROCESSING:
        values.setdefault("lease_token", None)
        values.setdefault("lease_expires_at", None)

    with transaction.atomic():
        qs = Job.objects.filter(pk=job_id)
        if token is not None:
            qs = qs.filter(lease_token=token)
        if condition is not None:
            qs = qs.filter(condition)
        if len(sources) == 1:
            from_status = sources[0]
        else:
            row = qs.select_for_update().values_list("status", flat=True).first()
            if row is None or row not in sources:
                _refuse(job_id, name, target, token)
            from_status = str(row)
        if not qs.filter(status=from_status).update(**values):
            _refuse(job_id, name, target, token)
        record_event(job_id, from_status, target, name, actor, reason, metadata, now)
        if target in TERMINAL:
            parent_id = (
                job.parent_id
                if isinstance(job, Job)
                else Job.objects.filter(pk=job_id).values_list("parent_id", flat=True).first()
            )
            if parent_id is not None:
                wake_parent_if_done(parent_id, now)

    if isinstance(job, Job):
        for attr, value in values.items():
            if attr != "status" and not hasattr(value, "resolve_expression"):
                setattr(job, attr, value)
        Job._meta.get_field("status").set_state(job, target)  # type: ignore[attr-defined]
        return job
    return None


def _refuse(job_id: Any, name: str, target: str, token: Any) -> None:
    row = Job.objects.filter(pk=job_id).values_list("status", "lease_token").first()
    if row is None:
        raise Job.DoesNotExist(f"Job {job_id} does not exist")
    status, lease_token = row
    if token is not None and (str(lease_token) != str(token) or status != Status.PROCESSING):
        logger.warning("Refused %s on job %s: lease token does not match", name, job_id)
        raise LeaseLost(job_id)
    raise InvalidTransition(status, target, name)


def wake_parent_if_done(parent_id: Any, now: datetime | None = None) -> bool:
    """Let a waiting parent run again once none of its children is active; until
    then, keep a waiting workflow's progress in step with its children."""
    now = now or timezone.now()
    _serialize_wakeups(parent_id)
    if Job.objects.filter(parent_id=parent_id, status__in=ACTIVE).exists():
        _waiting_progress(parent_id, now)
        return False
    return bool(
        Job.objects.filter(pk=parent_id, status=Status.QUEUED, run_after__gte=WAITING).update(run_after=now)
    )


def _serialize_wakeups(parent_id: Any) -> None:
    """PostgreSQL: a child's final transaction and its parent's ``suspend`` both take
    this lock before looking at the children, so whichever commits second sees the
    other's change: a parent can never go to sleep after its last child's wake-up."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"jobstate:wake:{parent_id}"])


def _waiting_progress(parent_id: Any, now: datetime) -> None:
    """A workflow waiting in a fan-out step (see jobstate.workflows) has no lease to
    report progress with: place its children's progress within the step's share."""
    band, total = (
        JobStep.objects.filter(job_id=parent_id, status="waiting")
        .values_list("detail__band", "detail__total")
        .first()
    ) or (None, None)
    if not band or not total:
        return
    active = Job.objects.filter(parent_id=parent_id, status__in=ACTIVE).aggregate(
        n=Count("pk"), p=Sum("progress")
    )
    done = max(0, total - active["n"])
    fraction = min(1.0, (done * 100 + (active["p"] or 0)) / (total * 100))
    waiting = Job.objects.filter(pk=parent_id, status=Status.QUEUED, run_after__gte=WAITING)
    # Cosmetic: skip it rather than wait for a parent row someone else is changing
    # (a cancel that cascades to this child's row would deadlock with us).
    if not waiting.select_for_update(skip_locked=True).values_list("pk", flat=True):
        return
    waiting.update(
        progress=max(0, min(100, int(band[0] + (band[1] - band[0]) * fraction))),
        progress_message=f"{done} of {total} child jobs finished",
        updated_at=now,
    )
