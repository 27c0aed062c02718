"""What a worker does with a job it holds: claim, heartbeat, progress.

Every call after the claim carries the lease token; a stale worker's call
matches no row and is refused with ``LeaseLost``, changing nothing. The calls
that end an attempt (complete, mark_partial, fail) are in ``outcomes``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Case, Count, F, Q, UUIDField, Value, When
from django.utils import timezone

from jobstate import conf, registry
from jobstate.exceptions import CancelRequested, LeaseLost
from jobstate.models import Job, JobEvent
from jobstate.models.job import CLAIM_ORDER
from jobstate.services.actors import Actor
from jobstate.services.transitions import announce, move
from jobstate.states import Status

logger = logging.getLogger("jobstate")

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
            # What this attempt runs on: complete() compares it with the input
            # watermark then, so an enqueue raising it meanwhile queues a re-run.
            claimed_watermark=F("input_watermark"),
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
    target = job if isinstance(job, Job) else Job(pk=job)
    move(
        target,
        "claim",
        actor=Actor.worker(worker_id),
        fields={
            "worker_id": worker_id,
            "lease_token": uuid.uuid4(),
            "lease_expires_at": _lease(now, lease_seconds),
            "heartbeat_at": now,
            "started_at": now,
            "attempts": F("attempts") + 1,
            "claimed_watermark": F("input_watermark"),
        },
        now=now,
    )
    if not isinstance(job, Job):
        return Job.objects.get(pk=target.pk)
    # The values the database computed (the caller's copy may predate an enqueue
    # that raised the watermark).
    job.refresh_from_db(fields=["attempts", "input_watermark", "claimed_watermark"])
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


def extend_leases(
    worker_id: str,
    leases: Iterable[tuple[Any, UUID | str]],
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> int:
    """Renew the leases of jobs a cluster claimed and still keeps queued in
    memory until one of its worker processes starts them (which relabels them).

    ``leases`` are ``(job id, lease token)`` pairs: only those are renewed, and
    only while still held under exactly ``worker_id``, so a job a dead worker
    process took is left to the reaper. Returns how many were renewed.
    """
    leases = list(leases)
    if not leases:
        return 0
    now = now or timezone.now()
    held = Q()
    for pk, token in leases:
        held |= Q(pk=pk, lease_token=token)
    return Job.objects.filter(held, status=Status.PROCESSING, worker_id=worker_id).update(
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
        logger.warning("Refused progress on job %s (status %s): lease lost", pk, row[0] if row else "missing")
        raise LeaseLost(pk)
    if isinstance(job, Job):
        for attr, value in values.items():
            setattr(job, attr, value)
