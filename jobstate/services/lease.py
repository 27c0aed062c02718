"""What a worker does with a job it holds: claim, begin, heartbeat, progress.

Claimed is not running. ``claim`` *reserves* jobs for a cluster (status
``processing`` under a lease token, ``started_at`` NULL, no attempt charged);
``begin`` is called by the worker process that is about to run the handler:
it charges the attempt and sets ``started_at``. A reserved job whose cluster
dies goes back to the queue without losing an attempt (see
``services.requeue_expired`` and docs/explanation/attempts.md).

Every call after the claim carries the lease token; a stale worker's call
matches no row and is refused with ``LeaseLost``, changing nothing. The calls
that end an attempt (complete, mark_partial, fail) are in ``outcomes``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from jobstate import registry
from jobstate.exceptions import (
    CancelRequested,
    ConcurrencyLimitReached,
    InvalidTransition,
    KindPaused,
    LeaseLost,
)
from jobstate.models import Job, KindPause
from jobstate.models.job import LeaseClock
from jobstate.services import _statements
from jobstate.services._rows import concrete_field
from jobstate.services._writes import job_columns, jobs_from_rows, lease_times, update_job, worker_label
from jobstate.services.actors import Actor
from jobstate.services.claiming import claim as claim  # services.claim: see claiming.py
from jobstate.services.claiming import kind_not_paused, room_for
from jobstate.services.pauses import check_not_paused
from jobstate.services.recovery_runs import recovering
from jobstate.services.transitions import lock_parent, move
from jobstate.states import Status
from jobstate.storable import text

logger = logging.getLogger("jobstate")

JobRef = Job | UUID | str


def _pk(job: JobRef) -> Any:
    return job.pk if isinstance(job, Job) else job


def update_held(
    pk: Any, token: UUID | str, values: dict[str, Any], *, untroubled: tuple[str, ...] = ()
) -> int:
    """Write ``values`` to the job held under ``token`` (``processing``, and for
    each of ``untroubled`` ("cancel", "stop") none requested); 0 or 1 row. No
    token holds nothing (``update_job`` would read None as "no token check")."""
    if token is None:
        return 0
    return update_job(pk, values, status=Status.PROCESSING, token=token, untroubled=untroubled)


@dataclass(frozen=True)
class Begun:
    """What ``begin`` found: the job as stored (with this attempt charged, unless
    a cancel was requested before it started, in which case nothing was written)."""

    job: Job
    attempt: int
    cancel_requested: bool


def begin(
    job: JobRef,
    token: UUID | str,
    worker_id: str,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> Begun:
    """A worker process starts the handler of a job its cluster reserved.

    One guarded UPDATE (this lease token, still ``processing``, not started,
    no cancel requested, its kind not paused) sets ``started_at``, charges the attempt
    (``attempts + 1``), relabels the holder with the worker process and renews
    the lease; where the database supports ``RETURNING`` the same statement
    loads the whole row, so the worker needs nothing else before the handler.

    If a cancel was requested before it started, nothing is written and
    ``cancel_requested`` is True (the caller ends it ``cancelled``; it never ran),
    unless this is the reaper's recovery run of a workflow's undos (``recovering``).
    If its kind is paused (``services.pause_kind``: the cluster reserved it before
    the pause), it is handed back instead: ``queued``, ready at once (no claim takes
    it until the resume), no attempt charged, its history row by the worker naming
    the pause; then ``KindPaused`` is raised, as ``start`` refuses it.
    Raises ``LeaseLost`` if the job is no longer held under ``token`` or was
    already begun. The lease runs from the database's clock on PostgreSQL unless
    ``now`` is given (``_writes.lease_times``), as in every lease write here; with
    ``USE_TZ = True`` a naive ``now`` is a ``ValidationError``, nothing written.
    ``lease_seconds`` (None: ``LEASE_SECONDS``) is more than 0 and at most a year, else ``ValueError``.
    ``worker_id`` is a string, else ``TypeError``.
    """
    worker_id = worker_label(worker_id)
    lease = lease_times(now, lease_seconds)
    now = now or timezone.now()
    pk = _pk(job)
    begun = _begin_returning(pk, token, worker_id, now, lease)
    if begun is None:
        begun = _begin_update(pk, token, worker_id, now, lease, cancel_free=True)
    if begun is not None:
        return Begun(begun, begun.attempts, False)
    # Refused: lost, cancelled or paused? Only now is the row read.
    current = Job.objects.filter(pk=pk).first()
    if (
        current is None
        or current.status != Status.PROCESSING
        or str(current.lease_token) != str(token)
        or current.started_at is not None
    ):
        raise LeaseLost(pk)
    if current.cancel_requested_at is not None:
        if not recovering(pk):
            return Begun(current, current.attempts, True)
        begun = _begin_update(pk, token, worker_id, now, lease, cancel_free=False)
        if begun is not None:
            return Begun(begun, begun.attempts, False)
    # Held, and no cancel keeps it from starting: the UPDATE's pause check refused it
    # (a pause resumed since then hands it back too: it is claimed again at once).
    # Not held any more: the move's token guard raises LeaseLost.
    _hand_back_paused(current, token, worker_id, now)
    raise KindPaused(current.kind)


def _hand_back_paused(job: Job, token: UUID | str, worker_id: str, now: datetime) -> None:
    """A reserved job of a paused kind goes back to the queue, never begun (no
    attempt was charged), as ``control.hand_back`` hands one back. One begun
    meanwhile (by another holder of the token) is not this caller's: ``LeaseLost``."""
    try:
        _requeue_unbegun(job, token, worker_id, now)
    except InvalidTransition:
        raise LeaseLost(job.pk) from None


def _requeue_unbegun(job: Job, token: UUID | str, worker_id: str, now: datetime) -> None:
    move(
        job,
        "requeue",
        actor=Actor.worker(worker_id),
        token=token,
        reason=f"kind '{job.kind}' paused before it started; it waits in the queue until resumed",
        fields={"worker_id": "", "run_after": now},
        metadata={"handed_back": True},
        # Only a job still never begun: one another holder of the token began
        # meanwhile is running (the move then refuses: LeaseLost).
        condition=Q(started_at__isnull=True),
        now=now,
    )


# What a lease write stores: (lease_expires_at, heartbeat_at), ``_writes.lease_times``.
Lease = tuple[datetime | LeaseClock, datetime | LeaseClock]


def _begin_update(
    pk: Any, token: Any, worker_id: str, now: datetime, lease: Lease, *, cancel_free: bool
) -> Job | None:
    held = Job.objects.filter(pk=pk, lease_token=token, status=Status.PROCESSING, started_at__isnull=True)
    held = held.filter(~Exists(KindPause.objects.active().filter(kind=OuterRef("kind"))))
    if cancel_free:
        held = held.filter(cancel_requested_at__isnull=True)
    if not held.update(
        started_at=now,
        attempts=F("attempts") + 1,
        worker_id=worker_id,
        heartbeat_at=lease[1],
        lease_expires_at=lease[0],
        updated_at=now,
    ):
        return None
    return Job.objects.get(pk=pk)


def _begin_returning(pk: Any, token: Any, worker_id: str, now: datetime, lease: Lease) -> Job | None:
    """``begin``'s UPDATE ... RETURNING (PostgreSQL, SQLite >= 3.35); None if the
    row did not match or the database cannot return rows from an UPDATE."""
    if not connection.features.can_return_columns_from_insert:
        return None
    meta = Job._meta
    qn = connection.ops.quote_name

    def prep(name: str, value: Any) -> Any:
        return concrete_field(Job, name).get_db_prep_value(value, connection)

    def assign(name: str, value: datetime | LeaseClock) -> tuple[str, list[Any]]:
        if isinstance(value, LeaseClock):
            sql, params = value.sql()
            return f"{qn(name)} = {sql}", list(params)
        return f"{qn(name)} = %s", [prep(name, value)]

    (beat, beat_params), (lease_sql, lease_params) = (
        assign("heartbeat_at", lease[1]),
        assign("lease_expires_at", lease[0]),
    )
    sql = (
        f"UPDATE {qn(meta.db_table)} SET {qn('started_at')} = %s, {qn('attempts')} = {qn('attempts')} + 1, "
        f"{qn('worker_id')} = %s, {beat}, {lease_sql}, {qn('updated_at')} = %s "
        f"WHERE {qn('id')} = %s AND {qn('lease_token')} = %s AND {qn('status')} = %s "
        f"AND {qn('started_at')} IS NULL AND {qn('cancel_requested_at')} IS NULL AND {kind_not_paused()} "
        f"RETURNING {job_columns(connection.vendor)}"
    )
    params = [
        prep("started_at", now),
        worker_id,
        *beat_params,
        *lease_params,
        prep("updated_at", now),
        prep("id", pk),
        prep("lease_token", token),
        str(Status.PROCESSING),
    ]
    rows = jobs_from_rows(_statements.fetch(sql, params))
    return rows[0] if rows else None


def start(
    job: JobRef, worker_id: str, *, lease_seconds: float | None = None, now: datetime | None = None
) -> Job:
    """Claim one specific queued job and begin it at once (run it inline, or the
    id-only path): ``claim`` and ``begin`` together, under the job's row lock.

    Refuses any other state (``InvalidTransition``), a paused kind (``KindPaused``)
    and a kind at its concurrency limit (``ConcurrencyLimitReached``), as a claim
    would skip it. A queued job whose cancel was requested is cancelled (it never
    ran), then refused, unless this is a recovery run of a workflow's undos (``recovering``).
    ``lease_seconds`` (None: ``LEASE_SECONDS``) is more than 0 and at most a year, else ``ValueError``.
    ``worker_id`` is a string, else ``TypeError``."""
    worker_id = worker_label(worker_id)
    lease_expires_at, heartbeat_at = lease_times(now, lease_seconds)
    now = now or timezone.now()
    target = job if isinstance(job, Job) else Job(pk=job)
    actor = Actor.worker(worker_id)
    with transaction.atomic():
        lock_parent(target)  # a cancel ends it: parents before children
        row = (
            Job.objects.select_for_update(no_key=True)
            .filter(pk=target.pk)
            .values_list("status", "kind", "cancel_requested_at")
        )
        found = row.first()
        if found is None:
            raise Job.DoesNotExist(f"Job {target.pk} does not exist")
        status, kind, requested = found
        if status != Status.QUEUED:
            raise InvalidTransition(status, Status.PROCESSING, "claim")
        cancelled = requested is not None and not recovering(target.pk)
        if not cancelled:
            check_not_paused(kind)
            room = room_for(kind)
            if room is not None and room <= 0:
                raise ConcurrencyLimitReached(kind, registry.concurrency_limits()[kind])
            move(
                target,
                "claim",
                actor=actor,
                fields={
                    "worker_id": worker_id,
                    "lease_token": uuid.uuid4(),
                    "lease_expires_at": lease_expires_at,
                    "heartbeat_at": heartbeat_at,
                    "started_at": now,
                    "attempts": F("attempts") + 1,
                    "claimed_watermark": F("input_watermark"),
                },
                now=now,
            )
        else:
            move(target, "cancel", actor=actor, reason="cancel requested before it started", now=now)
    if cancelled:
        raise InvalidTransition(Status.CANCELLED, Status.PROCESSING, "claim")
    if not isinstance(job, Job):
        return Job.objects.get(pk=target.pk)
    # The values the database computed (the caller's copy may predate an enqueue
    # that raised the watermark).
    job.refresh_from_db(
        fields=["attempts", "input_watermark", "claimed_watermark", "lease_expires_at", "heartbeat_at"]
    )
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
    ``lease_seconds`` (None: ``LEASE_SECONDS``) is more than 0 and at most a year, else ``ValueError``.
    ``worker_id`` is a string, else ``TypeError``.
    """
    lease_expires_at, heartbeat_at = lease_times(now, lease_seconds)
    pk = _pk(job)
    values: dict[str, Any] = {"lease_expires_at": lease_expires_at, "heartbeat_at": heartbeat_at}
    if worker_id is not None:
        values["worker_id"] = worker_label(worker_id)
    held = Job.objects.filter(pk=pk, lease_token=token, status=Status.PROCESSING)
    # The common case in one statement: the lease is ours and nothing was asked.
    if update_held(pk, token, values, untroubled=("cancel", "stop")):
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
    ``lease_seconds`` (None: ``LEASE_SECONDS``) is more than 0 and at most a year, else ``ValueError``.
    ``worker_id`` is a string, else ``TypeError``.
    """
    lease_expires_at, _ = lease_times(now, lease_seconds)  # checked first, leases or not
    worker_id = worker_label(worker_id)
    leases = list(leases)
    if not leases:
        return 0
    held = Q()
    for pk, token in leases:
        held |= Q(pk=pk, lease_token=token)
    return Job.objects.filter(held, status=Status.PROCESSING, worker_id=worker_id).update(
        lease_expires_at=lease_expires_at
    )


def progress_fields(
    percent: float | int | None, message: str | None = None, step: str | None = None
) -> dict[str, Any]:
    """The Job fields a progress report writes (``progress``, ``progress_message``,
    ``current_step``); raises ``ValidationError`` for a percent outside 0..100."""
    values: dict[str, Any] = {}
    if percent is not None:
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise ValidationError({"progress": ["Progress is a number between 0 and 100."]})
        values["progress"] = int(percent)
    if message is not None:
        values["progress_message"] = text(str(message)[:500])
    if step is not None:
        values["current_step"] = text(str(step)[:200])
    return values


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
    cancel was requested (``CancelRequested``: the handler should stop), and
    before anything, a naive ``now`` with ``USE_TZ = True`` (``ValidationError``).
    """
    values = progress_fields(percent, message, step)
    lease_expires_at, heartbeat_at = lease_times(now)
    now = now or timezone.now()
    pk = _pk(job)
    written = {
        **values,
        "heartbeat_at": heartbeat_at,
        "lease_expires_at": lease_expires_at,
        "updated_at": now,
    }
    if not update_held(pk, token, written, untroubled=("cancel",)):
        row = Job.objects.filter(pk=pk).values_list("status", "lease_token", "cancel_requested_at").first()
        if row and row[0] == Status.PROCESSING and str(row[1]) == str(token) and row[2]:
            raise CancelRequested(pk)
        logger.warning("Refused progress on job %s (status %s): lease lost", pk, row[0] if row else "missing")
        raise LeaseLost(pk)
    if isinstance(job, Job):
        for attr, value in values.items():
            setattr(job, attr, value)
