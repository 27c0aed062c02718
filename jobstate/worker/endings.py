"""Recording how an attempt ended: the outcome writes of the worker runner.

Every exit of an attempt (listed in ``jobstate.worker.runner``) ends here, or in
``jobstate.worker.unstarted`` for a handler that never ran to an outcome, in a
final, recorded state with the real error, or, when even that write fails, in
a lease left to run out into the reaper.
"""

from __future__ import annotations

import logging
import math
import time
import traceback as tb
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import Error as DatabaseErrors

from jobstate import services
from jobstate.exceptions import (
    CancelRequested,
    InvalidTransition,
    LeaseLost,
    NonRetryable,
    Partial,
    Suspend,
)
from jobstate.models import Job
from jobstate.states import Status
from jobstate.storable import exception_text
from jobstate.worker import unheard
from jobstate.worker.connections import (
    answers,
    reconnecting,
    until_answered,
    usable_connection,
)
from jobstate.worker.context import JobContext
from jobstate.worker.limits import hard_limit_for, lease_margin, timeout_for
from jobstate.worker.outcome_log import Stored, log_ended, logs

logger = logging.getLogger("jobstate")


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
    return ended_as(moved)


def ended_as(moved: Job | None) -> str:
    """What ``services.fail`` did, from the Job object it moved (no re-read)."""
    if moved is not None and moved.status == Status.CANCELLED:
        return "cancelled"
    return "retrying" if moved is not None and moved.status == Status.QUEUED else "failed"


# Asked as a job completes: the next job its worker process would claim, if any.
NextRequest = Callable[[], "services.NextClaim | None"]


OUTCOME_RECONNECTED = "the database connection was closed while the handler ran; its outcome is written again"


def finish(
    ctx: JobContext, kind: str, value: Any, then: NextRequest | None = None, *, within: float | None = None
) -> str:
    """Store the attempt's outcome. Whatever goes wrong here, the attempt ends
    in a recorded state (or, if nothing can be written, with the reaper).
    ``then``: see ``runner.run_job``. While the database does not answer, the
    write is tried again until the lease, or django-q2's hard limit, is about to
    run out, or for ``within`` seconds at most."""
    writes = 0
    asked: list[services.NextClaim | None] = []
    unstorable: list[Unstorable] = []  # what _unstorable's write would log

    def ask() -> services.NextClaim | None:
        # Once: a write made again claims with the same request (and its time).
        if not asked and then is not None:
            asked.append(then())
        return asked[0] if asked else None

    waited: list[BaseException] = []
    # Before the lease runs out, django-q2's hard limit, or ``within``.
    retry_until = _retry_until(ctx, within)

    def store() -> str:
        nonlocal writes
        writes += 1
        # No next job claimed with a write that waited for the database: it would begin
        # under a lease and a hard limit counted from the first try, mostly spent. The
        # worker claims its next job itself instead.
        request = ask if then is not None and not waited else None
        return _store(ctx, kind, value, request, unstorable)

    def waiting(exc: BaseException) -> None:
        if not waited:
            logger.warning(
                "Job %s: the database does not answer (%s: %s); its outcome (%s) is tried again "
                "for up to %.0f s",
                ctx.job.pk,
                type(exc).__name__,
                " ".join(exception_text(exc).split())[:200],  # one line: psycopg's span several
                kind,
                max(0.0, retry_until - time.monotonic()),
            )
        waited.append(exc)

    def written() -> str:
        # The server may have dropped the connection while the handler ran: its
        # outcome is written once more on a new one (guarded by the lease token)
        # rather than recorded as a failure, for a run that ended, to run again.
        return reconnecting(store, OUTCOME_RECONNECTED)

    try:
        # A database that does not answer (restarting, down, out of connections):
        # tried again while the lease holds, so a restart does not run work that
        # ended again. Once the heartbeat stopped, nothing renews the lease.
        ended = until_answered(written, retry_until, waiting)
    except (LeaseLost, InvalidTransition):
        if writes > 1:
            # Refused when written again: the first write may have committed before
            # the connection dropped (its answer lost with it). What it stored is
            # the attempt's outcome, not a lost lease.
            stored = unheard.stored_outcome(ctx)
            if stored != "lost":
                logger.info(
                    "Job %s: its outcome (%s) was stored before the connection dropped", ctx.job.pk, stored
                )
                request = asked[0] if asked else None
                if stored == "completed" and request is not None:
                    unheard.handed_over(ctx.job.pk, request)  # its next job, claimed with it
                if unstorable:  # the write that committed was _unstorable's
                    error, invalid = unstorable[-1]
                    log_ended(ctx.job, ctx.attempt, stored, error, exc=invalid)
                else:
                    _log(ctx, kind, value, stored, known=False)
                return stored
        logger.warning("Job %s: lease lost before its outcome was stored", ctx.job.pk)
        return "lost"
    except Exception as exc:
        if isinstance(exc, DatabaseErrors) and not answers():
            # Not even its failure could be written: one line, not two tracebacks.
            logger.error(
                "Job %s: its outcome (%s) could not be stored: the database did not answer "
                "before its lease ran out; the reaper will take it",
                ctx.job.pk,
                kind,
                exc_info=exc,
            )
            return "lost"
        return _store_failed(ctx, kind, exc)
    if waited:
        logger.info("Job %s: its outcome stored once the database answered again", ctx.job.pk)
    _log(ctx, kind, value, ended)
    return ended


def _retry_until(ctx: JobContext, within: float | None) -> float:
    """Until when (``time.monotonic()``) an outcome write is tried again: before the
    lease runs out (the reaper may give the job to another worker then), before
    django-q2's hard limit kills the process mid-write, and within ``within``."""
    margin = lease_margin()
    until = min(ctx.lease_until, ctx.began + hard_limit_for(ctx.spec)) - margin
    return until if within is None else min(until, time.monotonic() + within)


def _log(ctx: JobContext, kind: str, value: Any, ended: str, known: bool = True) -> None:
    """Log the stored outcome of an attempt that did not succeed. A result that
    could not be stored was logged with its outcome (``_unstorable``): a ``Partial``
    stored is "partial", which logs nothing. ``known``: the write's answer came, so
    the Job object holds the time a retry was given."""
    if kind == "ok" or isinstance(value, Partial) or not logs(ended):  # before anything is formatted
        return
    error: BaseException | Stored = value if kind != "interrupted" else _interrupt_error(ctx, value)
    retry_at = ctx.job.run_after if known and ended == "retrying" else None
    log_ended(ctx.job, ctx.attempt, ended, error, retry_at=retry_at)


CANCEL_GRACE_OVER = "stopped after the cancel grace period"


def _timed_out(ctx: JobContext) -> str:
    return f"Timed out after {timeout_for(ctx.spec):g} s"


def _interrupt_error(ctx: JobContext, why: str) -> Stored:
    """The error ``_store`` stored for an interrupt (a lost lease stores none)."""
    return ("Timeout", _timed_out(ctx)) if why == "timeout" else ("", CANCEL_GRACE_OVER)


# The failure a result that cannot be stored is recorded with, and why.
Unstorable = tuple[Stored, ValidationError]


def _store(
    ctx: JobContext, kind: str, value: Any, then: NextRequest | None, unstorable: list[Unstorable]
) -> str:
    job, token = ctx.job, ctx.token
    if kind == "ok":
        progress = ctx.take_progress()
        try:
            services.complete(job, token, value, progress=progress, then=then() if then is not None else None)
        except ValidationError as invalid:
            return _unstorable(ctx, invalid, progress, unstorable)
        return "completed"
    if kind == "interrupted":
        if value == "lease":
            return "lost"
        if value == "cancel":
            services.cancel_now(job, token, reason=CANCEL_GRACE_OVER, progress=ctx.take_progress())
            return "cancelled"
        return end_attempt(
            job,
            token,
            _timed_out(ctx),
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
            return _unstorable(ctx, error, progress, unstorable)
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


def _unstorable(
    ctx: JobContext, exc: ValidationError, progress: dict[str, Any], said: list[Unstorable]
) -> str:
    """The handler's result cannot be stored (not JSON): a property of the
    handler, not of the attempt, so the job fails for good (no re-run of its
    side effects) with that error, and with the progress the outcome would have stored.
    The error goes in ``said`` first: ``finish`` logs it if the write committed but
    its answer was lost."""
    detail = "; ".join(exc.messages) or str(exc)
    error = f"The handler's result could not be stored: {detail}"[:1000]
    said.append((("UnstorableResult", error), exc))
    ended = end_attempt(
        ctx.job,
        ctx.token,
        error,
        error_type="UnstorableResult",
        traceback="".join(tb.format_exception(exc)),
        retry=False,
        progress=progress,
    )
    log_ended(ctx.job, ctx.attempt, ended, ("UnstorableResult", error), exc=exc)
    return ended


def _store_failed(ctx: JobContext, kind: str, exc: Exception) -> str:
    """Writing the outcome raised (a database error, a hook that raised inside
    its transaction...): replace the connection if it broke, then record the
    attempt as failed with that error (retried while attempts remain), with
    the progress the outcome would have stored. Logged as the outcome line of what
    was stored (its error names the write's), else as the write's error."""
    error_type = type(exc).__name__
    try:
        usable_connection(math.inf)
        error = f"The outcome ({kind}) could not be stored: {error_type}: {exception_text(exc)}"[:1000]
        ended = end_attempt(
            ctx.job,
            ctx.token,
            error,
            error_type=error_type,
            traceback="".join(tb.format_exception(exc)),
            retry_delay=_delay(ctx),
            progress=ctx.take_progress(),
        )
    except (LeaseLost, InvalidTransition):
        logger.error("Job %s: its outcome (%s) could not be stored", ctx.job.pk, kind, exc_info=exc)
        return "lost"
    except Exception:
        logger.error("Job %s: its outcome (%s) could not be stored", ctx.job.pk, kind, exc_info=exc)
        logger.exception("Job %s: not even its failure could be stored; the reaper will take it", ctx.job.pk)
        return "lost"
    retry_at = ctx.job.run_after if ended == "retrying" else None
    log_ended(ctx.job, ctx.attempt, ended, (error_type, error), exc=exc, retry_at=retry_at)
    return ended


HARD_TIMEOUT = "Stopped by the worker's hard time limit"


def hard_timeout(ctx: JobContext) -> str:
    """django-q2's hard time limit stopped the handler (deaf to jobstate's own
    interrupts): the attempt failed with ``HardTimeout`` (retry policy; ``cancelled``
    if a cancel was requested), with the pending progress, which says where it
    stood. If that cannot be written, the lease runs out into the reaper."""
    try:
        ended = end_attempt(
            ctx.job, ctx.token, HARD_TIMEOUT, error_type="HardTimeout", progress=ctx.take_progress()
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception(
            "Job %s: its hard time limit could not be recorded; the reaper will take it", ctx.job.pk
        )
        return "lost"
    retry_at = ctx.job.run_after if ended == "retrying" else None
    log_ended(ctx.job, ctx.attempt, ended, ("HardTimeout", HARD_TIMEOUT), retry_at=retry_at)
    return ended


def _delay(ctx: JobContext) -> float:
    from jobstate.retry import backoff_seconds

    return backoff_seconds(ctx.attempt, ctx.spec)
