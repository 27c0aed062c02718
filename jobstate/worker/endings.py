"""Recording how an attempt ended: the outcome writes of the worker runner.

Every exit of an attempt (listed in ``jobstate.worker.runner``) ends here in a
final, recorded state with the real error, or, when even that write fails, in
a lease left to run out into the reaper.
"""

from __future__ import annotations

import logging
import math
import traceback as tb
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import connection

from jobstate import services
from jobstate.exceptions import (
    CancelRequested,
    InvalidTransition,
    LeaseLost,
    NonRetryable,
    Partial,
    Suspend,
)
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from jobstate.storable import exception_text
from jobstate.worker import unheard
from jobstate.worker.connections import close_quietly, reconnecting, usable_connection
from jobstate.worker.context import JobContext, lease_token
from jobstate.worker.limits import timeout_for

logger = logging.getLogger("jobstate")


class TransactionLeftOpen(NonRetryable):
    """The handler returned inside a transaction it had opened (an ``atomic()``
    entered and never exited, autocommit turned off, or a raw ``BEGIN`` never
    ended): its writes were rolled back. Never re-run, as for an unstorable
    result: its other side effects happened."""


def transaction_state() -> tuple[int, bool]:
    """How many atomic blocks this thread's connection is in, and whether it
    autocommits outside them (without connecting)."""
    return len(connection.atomic_blocks), connection.connection is None or connection.autocommit


def roll_back_left_open(before: tuple[int, bool]) -> bool:
    """Roll back what the handler left open since ``before`` (``transaction_state``);
    True if it had. Else the outcome would be written inside that transaction,
    never committed, and so would every later job of this worker process."""
    blocks, autocommit = before
    left = connection.atomic_blocks[blocks:]
    unset = autocommit and not left and connection.connection is not None and not connection.autocommit
    raw = autocommit and not left and not unset and _driver_in_transaction()
    if not left and not unset and not raw:
        return False
    try:
        error = TransactionLeftOpen("the handler left a transaction open")
        for block in reversed(left):
            block.__exit__(TransactionLeftOpen, error, None)  # rolls back, as an exception would
        if unset:
            connection.rollback()
            connection.set_autocommit(True)
        if raw:
            # Unknown to Django, so its rollback() would do nothing (psycopg2 skips it too).
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
    except Exception:
        logger.warning("The transaction a handler left open could not be rolled back", exc_info=True)
        close_quietly()
    return True


def _driver_in_transaction() -> bool:
    """Whether the driver's connection is in a transaction Django does not know of:
    a raw ``BEGIN`` the handler ran in autocommit mode and never ended."""
    raw = connection.connection
    if raw is None:
        return False
    if connection.vendor == "sqlite":
        try:
            return bool(raw.in_transaction)
        except Exception:  # closed under Django (by the handler): it holds no transaction
            return False
    # psycopg 3 and psycopg2 alike: 2 INTRANS, 3 INERROR (not 1, a query still active:
    # an interrupt's doing, and the connection is closed for it).
    status = getattr(getattr(raw, "info", None), "transaction_status", None)
    return status in (2, 3)


def end_attempt(
    job: Job,
    token: UUID | str | None,
    error: str,
    *,
    error_type: str,
    traceback: str = "",
    retry: bool = True,
    retry_delay: float | None = None,
    progress: dict[str, Any] | None = None,
    unstarted: bool = False,
) -> str:
    """End an attempt that failed or was interrupted: ``services.fail_held``, which
    stores ``progress`` and ends the job ``cancelled`` instead if a cancel was
    requested. Returns the outcome: "cancelled", "retrying" or "failed"."""
    moved = services.fail_held(
        job,
        token,
        error,
        error_type=error_type,
        traceback=traceback,
        retry=retry,
        retry_delay=retry_delay,
        progress=progress,
        unstarted=unstarted,
    )
    return _ended(moved)


def _ended(moved: Job | None) -> str:
    """What ``services.fail`` did, from the Job object it moved (no re-read)."""
    if moved is not None and moved.status == Status.CANCELLED:
        return "cancelled"
    return "retrying" if moved is not None and moved.status == Status.QUEUED else "failed"


def release(job: Job, exc: BaseException, why: str, *, begun: bool = False) -> str:
    """Hand back a job whose handler never started (say, the database failed):
    requeued or failed through the service layer, or cancelled if that was
    requested. If even that fails, the lease runs out into the reaper. ``begun``:
    ``begin`` had charged the attempt, which is refunded."""
    usable_connection(math.inf)
    try:
        return end_attempt(
            job,
            job.lease_token,
            f"{why}: {exception_text(exc)}"[:1000],
            error_type=type(exc).__name__,
            traceback="".join(tb.format_exception(exc)),
            unstarted=begun,
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception("Job %s could not be released; the reaper will take it", job.pk)
        return "lost"


def unknown_kind(job: Job) -> str:
    """No handler for this kind in this process: fail it, no retry (no attempt
    charged); cancelled instead if a cancel was requested."""
    try:
        moved = services.fail_held(
            job,
            job.lease_token,
            f"No handler registered for kind '{job.kind}'",
            error_type="UnknownKind",
            retry=False,
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    return _ended(moved)  # "cancelled" if a cancel was requested


STOPPED = "stopped by Ctrl-C (KeyboardInterrupt) while it ran inline; the attempt is not counted"


def hand_back_stopped(job: Job, token: UUID, ctx: JobContext | None = None) -> str:
    """Ctrl-C in an inline run (``runner.drain``): the operator stopped the run,
    the job did not fail. It goes back to the queue (with the pending progress
    of ``ctx``, if its handler started), ready at once, its attempt refunded
    (``services.hand_back``). Guarded by the lease token ``token``: an outcome
    already committed stays, and is returned (``stored_outcome``; "lost" if the
    lease was lost). If that fails, the lease runs out into the reaper."""
    close_quietly()  # the interrupt may have left it mid-command
    try:
        progress = ctx.take_progress() if ctx is not None else None
        services.hand_back(job, token, reason=STOPPED, progress=progress, stopped_run=True)
    except (LeaseLost, InvalidTransition):
        return stored_outcome(ctx) if ctx is not None else "lost"
    except Exception:
        logger.exception("Job %s could not be handed back; the reaper will take it", job.pk)
        return "lost"
    return "interrupted"


# What an attempt's outcome write stored, by the status its history row moved the job to.
_STORED: dict[str, str] = {
    Status.COMPLETED: "completed",
    Status.PARTIAL: "partial",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
    Status.WAITING: "suspended",
}


def stored_outcome(ctx: JobContext) -> str:
    """The outcome this attempt stored before a Ctrl-C cut its write short (the
    hand-back was refused: the job had left ``processing``), or before the
    connection dropped (``finish``'s write made again was refused), as ``finish``
    would have returned it: read from the history row the write made in its
    transaction (by this worker, since the attempt began). "lost" if there is
    none: the lease was lost (the reaper, another holder, an operator moved it)."""
    job = ctx.job
    mine = JobEvent.objects.filter(
        job_id=job.pk,
        from_status=Status.PROCESSING,
        actor_label=services.Actor.worker(ctx.worker_id).label[:200],
    )
    if job.started_at is not None:
        mine = mine.filter(created_at__gte=job.started_at)
    try:
        row = mine.order_by("-id").values_list("to_status", "metadata").first()
    except Exception:
        logger.warning("Job %s: could not read what its attempt stored", job.pk, exc_info=True)
        return "lost"
    if row is None:
        return "lost"
    status, metadata = row
    if status == Status.QUEUED:  # a retry records its error; a suspend(until=) is marked
        if metadata.get("suspended"):
            return "suspended"
        return "retrying" if "error" in metadata else "lost"
    return _STORED.get(status, "lost")


def cancel_unstarted(job: Job) -> str:
    """A cancel was requested before the handler started: it never ran."""
    try:
        services.cancel_now(job, lease_token(job), reason="cancelled before it started")
    except (LeaseLost, InvalidTransition):
        return "lost"
    return "cancelled"


# Asked as a job completes: the next job its worker process would claim, if any.
NextRequest = Callable[[], "services.NextClaim | None"]


OUTCOME_RECONNECTED = "the database connection was closed while the handler ran; its outcome is written again"


def finish(ctx: JobContext, kind: str, value: Any, then: NextRequest | None = None) -> str:
    """Store the attempt's outcome. Whatever goes wrong here, the attempt ends
    in a recorded state (or, if nothing can be written, with the reaper).
    ``then``: see ``runner.run_job``."""
    writes = 0
    asked: list[services.NextClaim | None] = []

    def ask() -> services.NextClaim | None:
        # Once: a write made again claims with the same request (and its time).
        if not asked and then is not None:
            asked.append(then())
        return asked[0] if asked else None

    def store() -> str:
        nonlocal writes
        writes += 1
        return _store(ctx, kind, value, ask if then is not None else None)

    try:
        # The server may have dropped the connection while the handler ran: its
        # outcome is written once more on a new one (guarded by the lease token)
        # rather than recorded as a failure, for a run that ended, to run again.
        return reconnecting(store, OUTCOME_RECONNECTED)
    except (LeaseLost, InvalidTransition):
        if writes > 1:
            # Refused when written again: the first write may have committed before
            # the connection dropped (its answer lost with it). What it stored is
            # the attempt's outcome, not a lost lease.
            stored = stored_outcome(ctx)
            if stored != "lost":
                logger.info(
                    "Job %s: its outcome (%s) was stored before the connection dropped", ctx.job.pk, stored
                )
                request = asked[0] if asked else None
                if stored == "completed" and request is not None:
                    unheard.handed_over(ctx.job.pk, request)  # its next job, claimed with it
                return stored
        logger.warning("Job %s: lease lost before its outcome was stored", ctx.job.pk)
        return "lost"
    except Exception as exc:
        return _store_failed(ctx, kind, exc)


def _store(ctx: JobContext, kind: str, value: Any, then: NextRequest | None) -> str:
    job, token = ctx.job, ctx.token
    if kind == "ok":
        progress = ctx.take_progress()
        try:
            services.complete(job, token, value, progress=progress, then=then() if then is not None else None)
        except ValidationError as invalid:
            return _unstorable(ctx, invalid, progress)
        return "completed"
    if kind == "interrupted":
        if value == "lease":
            return "lost"
        if value == "cancel":
            services.cancel_now(
                job, token, reason="stopped after the cancel grace period", progress=ctx.take_progress()
            )
            return "cancelled"
        return end_attempt(
            job,
            token,
            f"Timed out after {timeout_for(ctx.spec):g} s",
            error_type="Timeout",
            retry_delay=_delay(ctx),
            progress=ctx.take_progress(),
        )
    exc: Exception = value
    if isinstance(exc, CancelRequested):
        services.cancel_now(job, token, progress=ctx.take_progress())
        return "cancelled"
    if isinstance(exc, LeaseLost):
        logger.warning("Job %s: lease lost, result discarded", job.pk)
        return "lost"
    if isinstance(exc, Suspend):
        moved = services.suspend(job, token, until=exc.until, reason=exc.reason, progress=ctx.take_progress())
        return "cancelled" if moved is not None and moved.status == Status.CANCELLED else "suspended"
    if isinstance(exc, Partial):
        progress = ctx.take_progress()
        try:
            services.mark_partial(job, token, exc.result, exception_text(exc), progress=progress)
        except ValidationError as error:
            return _unstorable(ctx, error, progress)
        return "partial"
    return end_attempt(
        job,
        token,
        exception_text(exc) or type(exc).__name__,
        error_type=type(exc).__name__,
        traceback="".join(tb.format_exception(exc)),
        retry=not isinstance(exc, NonRetryable),
        retry_delay=_delay(ctx),
        progress=ctx.take_progress(),
    )


def _unstorable(ctx: JobContext, exc: ValidationError, progress: dict[str, Any]) -> str:
    """The handler's result cannot be stored (not JSON): a property of the
    handler, not of the attempt, so the job fails for good (no re-run of its
    side effects) with that error, and with the progress the outcome would have stored."""
    detail = "; ".join(exc.messages) or str(exc)
    logger.error("Job %s: the handler's result cannot be stored: %s", ctx.job.pk, detail)
    return end_attempt(
        ctx.job,
        ctx.token,
        f"The handler's result could not be stored: {detail}"[:1000],
        error_type="UnstorableResult",
        traceback="".join(tb.format_exception(exc)),
        retry=False,
        progress=progress,
    )


def _store_failed(ctx: JobContext, kind: str, exc: Exception) -> str:
    """Writing the outcome raised (a database error, a hook that raised inside
    its transaction...): replace the connection if it broke, then record the
    attempt as failed with that error (retried while attempts remain), with
    the progress the outcome would have stored."""
    logger.exception("Job %s: its outcome (%s) could not be stored", ctx.job.pk, kind)
    usable_connection(math.inf)
    try:
        return end_attempt(
            ctx.job,
            ctx.token,
            f"The outcome ({kind}) could not be stored: {type(exc).__name__}: {exception_text(exc)}"[:1000],
            error_type=type(exc).__name__,
            traceback="".join(tb.format_exception(exc)),
            retry_delay=_delay(ctx),
            progress=ctx.take_progress(),
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception("Job %s: not even its failure could be stored; the reaper will take it", ctx.job.pk)
        return "lost"


HARD_TIMEOUT = "Stopped by the worker's hard time limit"


def hard_timeout(ctx: JobContext) -> str:
    """django-q2's hard time limit stopped the handler (deaf to jobstate's own
    interrupts): the attempt failed with ``HardTimeout`` (retry policy; ``cancelled``
    if a cancel was requested), with the pending progress, which says where it
    stood. If that cannot be written, the lease runs out into the reaper."""
    try:
        return end_attempt(
            ctx.job, ctx.token, HARD_TIMEOUT, error_type="HardTimeout", progress=ctx.take_progress()
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception(
            "Job %s: its hard time limit could not be recorded; the reaper will take it", ctx.job.pk
        )
        return "lost"


def _delay(ctx: JobContext) -> float:
    from jobstate.retry import backoff_seconds

    return backoff_seconds(ctx.attempt, ctx.spec)
