"""The reaper: processing jobs whose lease expired, moved on by the rules of
``requeue_expired`` (each move a conditional UPDATE plus its history row)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from jobstate import hooks
from jobstate.exceptions import InvalidTransition, LeaseLost, sqlstate
from jobstate.models import Job
from jobstate.models.job import LeaseClock
from jobstate.services._writes import checked_limit, checked_now
from jobstate.services.actors import Actor
from jobstate.services.recovery_runs import recovering
from jobstate.services.transitions import lock_parent, move
from jobstate.states import Status

logger = logging.getLogger("jobstate")

__all__ = ["REAP_PARENT_WAIT_MS", "ReapReport", "requeue_expired"]


@dataclass
class ReapReport:
    requeued: list[Any] = field(default_factory=list)
    failed: list[Any] = field(default_factory=list)
    cancelled: list[Any] = field(default_factory=list)
    # Expired, but their row was held by a transaction (PostgreSQL): left for the
    # next sweep.
    skipped: list[Any] = field(default_factory=list)
    # Expired, but reaping them raised (logged; a hook's bug, say): left as they are,
    # so that one job cannot stop the sweep of the others.
    errors: list[Any] = field(default_factory=list)
    # The sweep stopped at its limit with expired jobs it never looked at: they
    # wait for the next sweep.
    more: bool = False

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.failed) + len(self.cancelled)


def requeue_expired(
    now: datetime | None = None, *, limit: int = 500, actor: Actor | None = None
) -> ReapReport:
    """The reaper: processing jobs whose lease expired go back to the queue
    (attempts left), or end ``failed`` with "worker lost" (none left), or
    ``cancelled`` when a cancel had been requested. The ``hooks.reaping`` hook may
    decide otherwise: a workflow with work left for a worker (its undos; see
    ``jobstate.workflows.recovery``) is requeued for one more run, which does not
    spend an attempt, or failed at once.

    A job that was only reserved (claimed by a cluster that stopped before one
    of its worker processes began it: ``started_at`` NULL) never ran: it goes
    back to the queue as it was, no attempt charged, never failed for lack of
    attempts (``cancelled`` if a cancel was requested, unless it is the recovery
    run of a workflow's undos, which a cancel does not stop: ``recovery_runs.recovering``).

    The history rows name ``actor``: the system's reaper unless given (the
    admin's "Run the reaper now" names the admin user). ``limit`` is an integer
    (``TypeError``) from 0 to ``MAX_LIMIT`` (``ValueError``); ``now`` is timezone-aware
    with ``USE_TZ = True`` (``ValidationError``)."""
    limit = checked_limit(limit)
    now = checked_now(now)
    # Expiry is judged at ``now`` when given, else by the database's clock on
    # PostgreSQL (``LeaseClock``); ``now`` still dates what the reaper writes.
    clock = now
    now = now or timezone.now()
    report = ReapReport()
    reaper = actor or Actor.system("reaper")
    # Oldest expiry first, a page at a time. Jobs left as they were (their reaping
    # raised, a hook's bug, every sweep again; or their row is held) do not count
    # against ``limit`` and the next page starts after them, so such jobs never hide
    # the others. A wait for a held parent's row (REAP_PARENT_WAIT_MS) does count:
    # that bounds the sweep's time.
    after: tuple[datetime, Any] | None = None
    waits = 0
    while (used := report.total + waits) < limit:
        size = limit - used
        rows = list(_expired_after(clock, after).values_list(*_REAP_COLUMNS)[:size])
        for row in rows:
            waits += _reap(row, report, reaper, now, clock)
        if len(rows) < size:
            break
        after = (rows[-1][-1], rows[-1][0])
    else:  # stopped by the limit: one more row tells whether any was left unseen
        report.more = _expired_after(clock, after).exists()
    return report


def _expired_after(now: datetime | None, after: tuple[datetime, Any] | None) -> QuerySet[Job]:
    """The jobs expired at ``now`` (None: ``LeaseClock``), oldest expiry first, past
    ``after`` (expiry, pk)."""
    page = Job.objects.expired(now)
    if after is not None:
        expiry, pk = after
        page = page.filter(Q(lease_expires_at__gt=expiry) | Q(lease_expires_at=expiry, pk__gt=pk))
    return page.order_by("lease_expires_at", "pk")


_REAP_COLUMNS = (
    "pk",
    "kind",
    "lease_token",
    "attempts",
    "max_attempts",
    "cancel_requested_at",
    "worker_id",
    "started_at",
    "lease_expires_at",
)


def _reap(
    row: tuple[Any, ...], report: ReapReport, reaper: Actor, now: datetime, clock: datetime | None
) -> bool:
    """One expired job's move (see ``requeue_expired``), recorded in ``report``.
    True when it waited REAP_PARENT_WAIT_MS for a held parent row (and left the job)."""
    pk, kind, token, attempts, max_attempts, cancel_at, worker, started, _expiry = row
    guard = {
        "token": token,
        "condition": _still_expired(clock),
        "actor": reaper,
        "now": now,
        "begun": started is not None,
    }
    meta = {"attempt": attempts, "worker": worker}
    lost = f"lease expired (worker {worker or '?'} lost)"
    last, cancelling = attempts >= max_attempts, cancel_at is not None
    try:
        with transaction.atomic():
            # The parent's row first (parents before children: see
            # transitions.lock_parent), as a move that ends this job would. A
            # job whose row someone holds is left for the next sweep: often the
            # handler's own transaction, after which its heartbeat renews the
            # lease; taking the job the moment that commits would run it twice.
            if not _lock_parent_briefly(pk):
                report.skipped.append(pk)
                return True
            locked = _lock_unless_held(pk, token)
            if locked is None:
                return False  # another reaper (every pusher runs one) or its worker moved it first
            if not locked:
                report.skipped.append(pk)
                return False
            if started is None:
                reserved = f"reserved by a cluster that stopped before starting it ({worker or '?'})"
                meta["reserved"] = True
                if cancelling and not recovering(pk):
                    move(pk, "cancel", reason=f"{reserved}; cancel requested", metadata=meta, **guard)
                    report.cancelled.append(pk)
                else:
                    fields = {"run_after": now, "worker_id": ""}
                    move(pk, "requeue", reason=reserved, fields=fields, metadata=meta, **guard)
                    report.requeued.append(pk)
                return False
            plan = hooks.reaping.ask(hooks.Expired(pk, kind, last=last, cancelling=cancelling))
            if plan is not None and plan.action:
                move(
                    pk,
                    "requeue",
                    reason=f"{lost}: {plan.reason}",
                    fields={"run_after": now, "worker_id": "", "attempts": F("attempts") - 1},
                    metadata={**meta, "recovery": plan.action},
                    **guard,
                )
                if plan.then is not None:
                    plan.then(pk, reaper, now)
                report.requeued.append(pk)
            elif plan is not None:
                move(
                    pk,
                    "fail",
                    reason=plan.error[:1000],
                    metadata=meta,
                    fields={"error_message": plan.error, "error_type": "WorkerLost"},
                    **guard,
                )
                report.failed.append(pk)
            elif cancel_at is not None:
                move(pk, "cancel", reason="worker lost while cancelling", metadata=meta, **guard)
                report.cancelled.append(pk)
            elif attempts < max_attempts:
                move(
                    pk,
                    "requeue",
                    reason=lost,
                    fields={"run_after": now, "worker_id": ""},
                    metadata=meta,
                    **guard,
                )
                report.requeued.append(pk)
            else:
                move(
                    pk,
                    "fail",
                    reason="worker lost",
                    metadata=meta,
                    fields={"error_message": "worker lost", "error_type": "WorkerLost"},
                    **guard,
                )
                report.failed.append(pk)
    except (LeaseLost, InvalidTransition):
        pass  # a heartbeat or the worker itself got there first
    except DatabaseError:
        raise  # the database's trouble, not this job's: the sweep stops here
    except Exception:
        logger.exception("Reaping expired job %s failed; it is left as it is", pk)
        report.errors.append(pk)
    return False


# How long the reaper waits for an expired job's parent row (PostgreSQL): long
# enough for a sibling's final transaction, not for a parent's long one.
REAP_PARENT_WAIT_MS = 1000


def _lock_parent_briefly(pk: Any) -> bool:
    """``lock_parent``, giving up (False) after REAP_PARENT_WAIT_MS on PostgreSQL."""
    if connection.vendor != "postgresql":
        lock_parent(pk)
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (before,) = cursor.fetchone()
    try:
        with transaction.atomic():  # a savepoint: a timeout rolls back only this
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{REAP_PARENT_WAIT_MS}ms"])
            lock_parent(pk)
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])
    except OperationalError as exc:
        if sqlstate(exc) == "55P03":  # lock_not_available: our lock_timeout
            return False
        raise
    return True


def _lock_unless_held(pk: Any, token: Any) -> bool | None:
    """Lock the job's row, unless another transaction holds it (False; PostgreSQL: on
    SQLite the reaper's transaction waits for the database's write lock instead).
    None when the row no longer holds the lease ``token`` the sweep read: another
    sweep requeued it meanwhile (after an outage every cluster's reaper finds the
    same expired jobs), or its worker's outcome came first. Its move would be
    refused, logged as a stale worker's."""
    rows = Job.objects.filter(pk=pk)
    skip_locked = connection.features.has_select_for_update_skip_locked
    if skip_locked:
        rows = rows.select_for_update(skip_locked=True, no_key=True)
    found = list(rows.values_list("status", "lease_token"))
    if not found:
        return False if skip_locked else None
    status, lease = found[0]
    return True if status == Status.PROCESSING and str(lease) == str(token) else None


def _still_expired(now: datetime | None) -> Any:
    return Q(lease_expires_at__lt=now or LeaseClock())
