"""Ending an attempt whose handler never ran to an outcome of its own.

Never started (a setup failure, an unknown kind, a paused kind, a cancel that
came first), stopped by Ctrl-C in an inline run, or stopped by django-q2's hard
limit outside the handler. Each is recorded through the service layer; when
that write fails, the lease runs out into the reaper.
"""

from __future__ import annotations

import logging
import math
import traceback as tb
from typing import Any
from uuid import UUID

from jobstate import services
from jobstate.exceptions import InvalidTransition, KindPaused, LeaseLost
from jobstate.models import Job
from jobstate.storable import exception_text
from jobstate.worker import unheard
from jobstate.worker.connections import close_quietly, usable_connection
from jobstate.worker.context import JobContext, lease_token
from jobstate.worker.endings import HARD_TIMEOUT, end_attempt, ended_as
from jobstate.worker.outcome_log import Stored, log_ended

logger = logging.getLogger("jobstate")


def release(job: Job, exc: BaseException, why: str, *, refund: bool = False) -> str:
    """Hand back a job whose handler never started (say, the database failed):
    requeued or failed through the service layer, or cancelled if that was
    requested. If even that fails, the lease runs out into the reaper. ``refund``:
    no attempt is charged (``begin``'s refunded), but past
    ``JOBSTATE["SETUP_FAILURES_REFUNDED"]`` such failures in a row
    (``services.fail``'s ``unstarted``); else the attempt is charged."""
    usable_connection(math.inf)
    attempt = _unstarted_attempt(job)
    error = f"{why}: {exception_text(exc) or type(exc).__name__}"[:1000]
    try:
        moved = services.fail_held(
            job,
            job.lease_token,
            error,
            error_type=type(exc).__name__,
            traceback="".join(tb.format_exception(exc)),
            unstarted=refund,
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception("Job %s could not be released; the reaper will take it", job.pk)
        return "lost"
    ended = ended_as(moved)
    # A requeue that charged nothing (refunded) is logged as such, not as a failed attempt.
    charged = moved is None or moved.attempts >= attempt
    _log_unstarted(job, attempt, ended, (type(exc).__name__, error), exc, charged=charged)
    return ended


def _unstarted_attempt(job: Job) -> int:
    """The attempt a job whose handler never started was at, read before its outcome
    is written (which may refund it): ``begin``'s, or the one it was to begin."""
    return job.attempts if job.started_at is not None else job.attempts + 1


def _log_unstarted(
    job: Job,
    attempt: int,
    ended: str,
    error: Stored,
    exc: BaseException | None = None,
    *,
    charged: bool = True,
) -> None:
    retry_at = job.run_after if ended == "retrying" else None
    log_ended(job, attempt, ended, error, exc=exc, retry_at=retry_at, charged=charged)


def unknown_kind(job: Job) -> str:
    """No handler for this kind in this process: fail it, no retry (no attempt
    charged); cancelled instead if a cancel was requested."""
    attempt = _unstarted_attempt(job)
    error = f"No handler registered for kind '{job.kind}'"
    try:
        moved = services.fail_held(job, job.lease_token, error, error_type="UnknownKind", retry=False)
    except (LeaseLost, InvalidTransition):
        return "lost"
    ended = ended_as(moved)  # "cancelled" if a cancel was requested
    _log_unstarted(job, attempt, ended, ("UnknownKind", error))
    return ended


STOPPED = "stopped by Ctrl-C (KeyboardInterrupt) while it ran inline; the attempt is not counted"


def hand_back_stopped(job: Job, token: UUID, ctx: JobContext | None = None) -> str:
    """Ctrl-C in an inline run (``runner.drain``): the operator stopped the run,
    the job did not fail. It goes back to the queue (with the pending progress
    of ``ctx``, if its handler started), ready at once, its attempt refunded
    (``services.hand_back``). Guarded by the lease token ``token``: an outcome
    already committed stays, and is returned (``unheard.stored_outcome``; "lost"
    if the lease was lost). If that fails, the lease runs out into the reaper."""
    close_quietly()  # the interrupt may have left it mid-command
    try:
        progress = ctx.take_progress() if ctx is not None else None
        services.hand_back(job, token, reason=STOPPED, progress=progress, stopped_run=True)
    except (LeaseLost, InvalidTransition):
        return unheard.stored_outcome(ctx) if ctx is not None else "lost"
    except Exception:
        logger.exception("Job %s could not be handed back; the reaper will take it", job.pk)
        return "lost"
    return "interrupted"


def paused_unstarted(job_id: Any, paused: KindPaused) -> str:
    """``begin`` refused a job of a paused kind and handed it back to the queue."""
    logger.info(
        "Job %s not started: kind '%s' was paused; handed back to the queue, no attempt charged",
        job_id,
        paused.kind,
    )
    return "paused"


CANCELLED_UNSTARTED = "cancelled before it started"


def cancel_unstarted(job: Job) -> str:
    """A cancel was requested before the handler started: it never ran."""
    attempt = _unstarted_attempt(job)
    try:
        services.cancel_now(job, lease_token(job), reason=CANCELLED_UNSTARTED)
    except (LeaseLost, InvalidTransition):
        return "lost"
    _log_unstarted(job, attempt, "cancelled", ("", CANCELLED_UNSTARTED))
    return "cancelled"


def hard_timeout_outside(job: Job, token: UUID | str | None) -> str:
    """django-q2's hard time limit fired outside the handler (around it, or as its
    outcome was written): the attempt failed with ``HardTimeout``, unless an outcome
    is stored already (refused: "lost")."""
    attempt = _unstarted_attempt(job)
    try:
        ended = end_attempt(job, token, HARD_TIMEOUT, error_type="HardTimeout")
    except (LeaseLost, InvalidTransition):
        return "lost"
    _log_unstarted(job, attempt, ended, ("HardTimeout", HARD_TIMEOUT))
    return ended
