"""What a worker does with a job it holds: claim, heartbeat, progress, finish.

Every call after the claim carries the lease token; a stale worker's call
matches no row and is refused with ``LeaseLost``, changing nothing.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Case, Count, F, UUIDField, Value, When
from django.utils import timezone

from jobstate import conf, registry
from jobstate.exceptions import CancelRequested, InvalidTransition, LeaseLost
from jobstate.models import Job, JobEvent
from jobstate.models.job import CLAIM_ORDER
from jobstate.retry import backoff_seconds
from jobstate.services.actors import Actor
from jobstate.services.transitions import announce, move
from jobstate.states import Status

JobRef = Job | UUID | str


def _pk(job: JobRef) -> Any:
    return job.pk if isinstance(job, Job) else job


def _lease(now: datetime, lease_seconds: float | None) -> datetime:
    return now + timedelta(seconds=lease_seconds or conf.get("LEASE_SECONDS"))


def claim(
    worker_id: str,
    kinds: list[str] | None = None,
    limit: int = 1,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> list[Job]:
    """Atomically take up to ``limit`` ready jobs, each under a fresh lease token.

    PostgreSQL locks candidates with ``FOR UPDATE SKIP LOCKED``; SQLite's
    IMMEDIATE transactions serialize claimers and the UPDATE re-checks the
    status (compare-and-set). Per-kind concurrency limits count processing jobs
    under a per-kind lock, so they hold across every worker and machine.
    """
    now = now or timezone.now()
    limits = registry.concurrency_limits()
    if kinds is not None:
        limits = {k: v for k, v in limits.items() if k in kinds}
    with transaction.atomic():
        qs = Job.objects.filter(status=Status.QUEUED, run_after__lte=now)
        if kinds is not None:
            qs = qs.filter(kind__in=kinds)
        room: dict[str, int] = {}
        if limits:
            _lock_kinds(sorted(limits))
            running = dict(
                Job.objects.filter(status=Status.PROCESSING, kind__in=list(limits))
                .values("kind")
                .annotate(n=Count("id"))
                .values_list("kind", "n")
            )
            room = {k: limit_ - running.get(k, 0) for k, limit_ in limits.items()}
            full = [k for k, r in room.items() if r <= 0]
            if full:
                qs = qs.exclude(kind__in=full)
        qs = qs.order_by(*CLAIM_ORDER)
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        ids: list[Any] = []
        for pk, kind in qs.values_list("pk", "kind")[: limit * 4 if room else limit]:
            if kind in room:
                if room[kind] <= 0:
                    continue
                room[kind] -= 1
            ids.append(pk)
            if len(ids) == limit:
                break
        if not ids:
            return []
        tokens = {pk: uuid.uuid4() for pk in ids}
        Job.objects.filter(pk__in=ids, status=Status.QUEUED).update(
            status=Status.PROCESSING,
            worker_id=worker_id,
            lease_token=Case(
                *[When(pk=pk, then=Value(token)) for pk, token in tokens.items()],
                output_field=UUIDField(),
            ),
            lease_expires_at=_lease(now, lease_seconds),
            heartbeat_at=now,
            started_at=now,
            attempts=F("attempts") + 1,
            updated_at=now,
        )
        jobs = sorted(
            Job.objects.filter(pk__in=ids, status=Status.PROCESSING, worker_id=worker_id).filter(
                lease_token__in=list(tokens.values())
            ),
            key=lambda j: ids.index(j.pk),
        )
        actor = Actor.worker(worker_id)
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=job.pk,
                    from_status=Status.QUEUED,
                    to_status=Status.PROCESSING,
                    transition="claim",
                    actor_label=actor.label,
                    metadata={"attempt": job.attempts},
                    created_at=now,
                )
                for job in jobs
            ]
        )
        for job in jobs:
            announce(job.pk, Status.QUEUED, Status.PROCESSING, "claim", actor)
    return jobs


def _lock_kinds(kinds: list[str]) -> None:
    if connection.vendor != "postgresql":
        return  # SQLite: the IMMEDIATE transaction already holds the write lock.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtext('jobstate:' || k)) "
            "FROM unnest(%s::text[]) AS k ORDER BY k",
            [kinds],
        )


def start(
    job: JobRef, worker_id: str, *, lease_seconds: float | None = None, now: datetime | None = None
) -> Job:
    """Claim one specific queued job (e.g. to run it inline); refuses any other state."""
    now = now or timezone.now()
    token = uuid.uuid4()
    pk = _pk(job)
    moved = move(
        job if isinstance(job, Job) else Job(pk=pk),
        "claim",
        actor=Actor.worker(worker_id),
        fields={
            "worker_id": worker_id,
            "lease_token": token,
            "lease_expires_at": _lease(now, lease_seconds),
            "heartbeat_at": now,
            "started_at": now,
            "attempts": F("attempts") + 1,
        },
        now=now,
    )
    assert moved is not None
    return Job.objects.get(pk=pk) if not isinstance(job, Job) else _reload_attempts(moved)


def _reload_attempts(job: Job) -> Job:
    job.attempts = Job.objects.filter(pk=job.pk).values_list("attempts", flat=True).get()
    return job


@dataclass(frozen=True)
class Beat:
    cancel_requested: bool
    stop_requested: bool


def heartbeat(
    job: JobRef,
    token: UUID | str,
    *,
    lease_seconds: float | None = None,
    worker_id: str | None = None,
    now: datetime | None = None,
) -> Beat:
    """Renew the lease; tell the worker whether a cancel or stop was requested.

    ``worker_id`` re-labels the holder, e.g. when a cluster's pusher claimed the
    job and one of its worker processes now runs it under the same token.
    """
    now = now or timezone.now()
    pk = _pk(job)
    values: dict[str, Any] = {"lease_expires_at": _lease(now, lease_seconds), "heartbeat_at": now}
    if worker_id is not None:
        values["worker_id"] = worker_id[:200]
    held = Job.objects.filter(pk=pk, lease_token=token, status=Status.PROCESSING)
    # The common case in one statement: the lease is ours and nothing was asked.
    if held.filter(cancel_requested_at__isnull=True, stop_requested_at__isnull=True).update(**values):
        return Beat(False, False)
    with transaction.atomic():
        if not held.update(**values):
            raise LeaseLost(pk)
        cancel_at, stop_at = (
            Job.objects.filter(pk=pk).values_list("cancel_requested_at", "stop_requested_at").get()
        )
    return Beat(cancel_at is not None, stop_at is not None)


def extend_leases(worker_id: str, *, lease_seconds: float | None = None, now: datetime | None = None) -> int:
    """Renew every lease held under exactly ``worker_id``: jobs a cluster claimed
    and keeps queued in memory until one of its worker processes starts them
    (which relabels them). Returns how many were renewed."""
    now = now or timezone.now()
    return Job.objects.filter(status=Status.PROCESSING, worker_id=worker_id).update(
        lease_expires_at=_lease(now, lease_seconds)
    )


def report_progress(
    job: JobRef,
    token: UUID | str,
    percent: float | int | None,
    message: str | None = None,
    *,
    step: str | None = None,
    now: datetime | None = None,
) -> None:
    """Store progress (0..100) and renew the lease in one UPDATE.

    Refused (nothing written) when the token is stale (``LeaseLost``) or when a
    cancel was requested (``CancelRequested``: the handler should stop).
    """
    values: dict[str, Any] = {}
    if percent is not None:
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise ValidationError({"progress": ["Progress is a number between 0 and 100."]})
        values["progress"] = int(percent)
    if message is not None:
        values["progress_message"] = str(message)[:500]
    if step is not None:
        values["current_step"] = str(step)[:200]
    now = now or timezone.now()
    pk = _pk(job)
    updated = Job.objects.filter(
        pk=pk, lease_token=token, status=Status.PROCESSING, cancel_requested_at__isnull=True
    ).update(**values, heartbeat_at=now, lease_expires_at=_lease(now, None), updated_at=now)
    if not updated:
        row = Job.objects.filter(pk=pk).values_list("status", "lease_token", "cancel_requested_at").first()
        if row and row[0] == Status.PROCESSING and str(row[1]) == str(token) and row[2]:
            raise CancelRequested(pk)
        import logging

        logging.getLogger("jobstate").warning(
            "Refused progress on job %s (status %s): lease lost", pk, row[0] if row else "missing"
        )
        raise LeaseLost(pk)
    if isinstance(job, Job):
        for attr, value in values.items():
            setattr(job, attr, value)


def _json(value: Any, field: str) -> Any:
    try:
        return json.loads(json.dumps(value, cls=DjangoJSONEncoder))
    except (TypeError, ValueError) as exc:
        raise ValidationError({field: [f"Not JSON-serialisable: {exc}"]}) from None


def complete(
    job: JobRef,
    token: UUID | str,
    result: Any = None,
    *,
    actor: Actor | None = None,
    reason: str = "",
    now: datetime | None = None,
) -> Job | None:
    """End the job ``completed`` with ``result``.

    With a key, the job records the watermark it was claimed at as its last
    successful one; if the watermark was raised while it ran, a follow-up job
    with the same key is queued in the same transaction (the input is dirty).
    """
    result = _json(result, "result")
    now = now or timezone.now()
    seen = job.input_watermark if isinstance(job, Job) else None
    key = job.key if isinstance(job, Job) else None
    # Errors of earlier attempts stay in the history, not on a completed job.
    fields = {"result": result, "progress": 100, "error_message": "", "error_type": "", "traceback": ""}
    fields["last_success_watermark"] = seen
    who = actor or _worker_actor(job)
    if isinstance(job, Job) and key is None:
        # No key, no re-run rule: move's own transaction is enough (no savepoint).
        return move(job, "complete", actor=who, token=token, reason=reason, fields=fields, now=now)
    with transaction.atomic():
        if not isinstance(job, Job):
            seen, key = Job.objects.filter(pk=job).values_list("input_watermark", "key").first() or (
                None,
                None,
            )
        fields["last_success_watermark"] = seen
        moved = move(job, "complete", actor=who, token=token, reason=reason, fields=fields, now=now)
        if key is not None:
            _rerun_if_dirty(_pk(job), seen)
    return moved


def _rerun_if_dirty(pk: Any, seen: int | None) -> None:
    from jobstate.services.enqueue import get_or_enqueue

    row = (
        Job.objects.filter(pk=pk)
        .values_list("input_watermark", "kind", "key", "parameters", "owner_id", "priority")
        .get()
    )
    current, kind, key, parameters, owner_id, priority = row
    if current is not None and (seen is None or current > seen):
        owner = Job._meta.get_field("owner").related_model.objects.filter(pk=owner_id).first()  # type: ignore[union-attr]
        get_or_enqueue(
            kind,
            parameters,
            owner=owner,
            key=key,
            watermark=current,
            priority=priority,
            actor=Actor.system("watermark"),
            reason="input changed while running",
        )


def mark_partial(
    job: JobRef,
    token: UUID | str,
    result: Any = None,
    error: str = "",
    *,
    actor: Actor | None = None,
    now: datetime | None = None,
) -> Job | None:
    """End the job ``partial``: some result, and an error saying what is missing."""
    return move(
        job,
        "mark_partial",
        actor=actor or _worker_actor(job),
        token=token,
        reason=error,
        fields={"result": _json(result, "result"), "progress": 100, "error_message": error or ""},
        now=now,
    )


def fail(
    job: JobRef,
    token: UUID | str | None,
    error: str,
    *,
    error_type: str = "",
    traceback: str = "",
    retry: bool = True,
    retry_delay: float | None = None,
    actor: Actor | None = None,
    now: datetime | None = None,
) -> Job | None:
    """Fail the current attempt: requeue with backoff while attempts remain
    (and ``retry``), else end the job ``failed`` with the error."""
    now = now or timezone.now()
    error = (error or error_type or "failed").strip() or "failed"
    pk = _pk(job)
    with transaction.atomic():
        row = (
            Job.objects.select_for_update()
            .filter(pk=pk)
            .values_list("status", "lease_token", "attempts", "max_attempts", "kind")
            .first()
        )
        if row is None:
            raise Job.DoesNotExist(f"Job {pk} does not exist")
        status, lease_token, attempts, max_attempts, kind = row
        if token is not None and (str(lease_token) != str(token) or status != Status.PROCESSING):
            raise LeaseLost(pk)
        details = {
            "attempt": attempts,
            "error": error,
            "error_type": error_type,
            "traceback": traceback[-8000:],
        }
        fields = {"error_message": error, "error_type": error_type[:200], "traceback": traceback}
        if retry and status == Status.PROCESSING and attempts < max_attempts:
            if retry_delay is None:
                spec = registry.all_handlers().get(kind)
                retry_delay = backoff_seconds(attempts, spec)
            run_after = now + timedelta(seconds=retry_delay)
            details["retry_at"] = run_after.isoformat()
            return move(
                job,
                "requeue",
                actor=actor or _worker_actor(job),
                token=token,
                reason=f"attempt {attempts} failed: {error}"[:1000],
                fields={**fields, "run_after": run_after, "worker_id": ""},
                metadata=details,
                now=now,
            )
        if status not in (Status.QUEUED, Status.PROCESSING):
            raise InvalidTransition(status, Status.FAILED, "fail")
        return move(
            job,
            "fail",
            actor=actor or _worker_actor(job),
            token=token,
            reason=error[:1000],
            fields=fields,
            metadata=details,
            now=now,
        )


def _worker_actor(job: JobRef) -> Actor:
    worker = job.worker_id if isinstance(job, Job) else ""
    return Actor.worker(worker) if worker else Actor("worker")
