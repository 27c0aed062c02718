"""The worker's log line for an attempt that did not succeed, written once its
outcome is stored, so that it says what happened: a retry (WARNING), a job that
failed for good (ERROR, with the handler's traceback), a cancel (INFO). An
attempt that succeeded, ended ``partial``, suspended or lost its lease logs
nothing here.

Each record carries ``job_id``, ``kind``, ``attempt``, ``max_attempts``,
``outcome``, ``error_type`` and ``retry_at`` as attributes (``extra``), for a log
aggregator to group by."""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from datetime import datetime

from jobstate.models import Job
from jobstate.storable import exception_text, text

logger = logging.getLogger("jobstate.worker")

LEVELS = {"retrying": logging.WARNING, "failed": logging.ERROR, "cancelled": logging.INFO}
MESSAGE_CHARS = 500
_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")

Stored = tuple[str, str]
"""An error as the job row stores it: ``(error_type, error)``."""


def logs(ended: str) -> bool:
    """Whether ``log_ended`` would log this outcome at the level set now."""
    level = LEVELS.get(ended)
    return level is not None and logger.isEnabledFor(level)


def log_ended(
    job: Job,
    attempt: int,
    ended: str,
    error: BaseException | Stored,
    *,
    exc: BaseException | None = None,
    retry_at: datetime | None = None,
    charged: bool = True,
) -> None:
    """Log attempt ``attempt`` of ``job``, whose stored outcome is ``ended``
    ("retrying", "failed" or "cancelled"; any other logs nothing, at the cost of
    one dict lookup). ``error``: the handler's exception, described as the job row
    stores it (its type, its text), or the stored ``(error_type, error)``; ``exc``
    (default: ``error`` if an exception): the exception whose traceback a job failed
    for good logs. ``retry_at``: when a retried job runs again (None: not known).
    ``charged``: False for a requeue that charged no attempt (the handler never
    started and the attempt was refunded): logged as a start that failed, attempt
    ``attempt`` still to run.
    Never raises: the outcome is stored, and a logging filter or handler that fails
    must not undo the ending."""
    if not logs(ended):  # before anything is formatted
        return
    try:
        if isinstance(error, BaseException):
            exc = exc if exc is not None else error
            error = (type(error).__name__, exception_text(error) or type(error).__name__)
        _log_ended(job, attempt, ended, *error, exc, retry_at, charged)
    except Exception:
        with contextlib.suppress(Exception):
            logger.exception("Job %s: its outcome (%s) could not be logged", job.pk, ended)


def _log_ended(
    job: Job,
    attempt: int,
    ended: str,
    error_type: str,
    error: str,
    exc: BaseException | None,
    retry_at: datetime | None,
    charged: bool,
) -> None:
    what = f"{error_type}: {_one_line(error)}" if error_type and error != error_type else _one_line(error)
    fields = {
        "job_id": str(job.pk),
        "kind": job.kind,
        "attempt": attempt,
        "max_attempts": job.max_attempts,
        "outcome": ended,
        "error_type": error_type,
        "retry_at": retry_at.isoformat() if retry_at is not None else None,
    }
    head = (job.pk, job.kind, attempt, job.max_attempts)
    if ended == "retrying":
        again = f"runs again at {retry_at.isoformat(timespec='seconds')}" if retry_at else "runs again later"
        if charged:
            logger.warning("Job %s (%s) attempt %d of %d failed; %s: %s", *head, again, what, extra=fields)
        else:
            logger.warning(
                "Job %s (%s) could not start attempt %d of %d (no attempt charged); %s: %s",
                *head,
                again,
                what,
                extra=fields,
            )
    elif ended == "failed":
        # The handler's own exception: its traceback, not that of the frames logging it.
        # One whose text holds a NUL or a lone surrogate (an undecodable file name) would
        # make a UTF-8 handler fail on the record: then the text as stored, in the message.
        shown = "".join(traceback.format_exception(exc)) if exc is not None else ""
        if shown and text(shown) != shown:
            what, exc = f"{what}\n{text(shown).rstrip()}", None
        logger.error("Job %s (%s) failed on attempt %d of %d: %s", *head, what, exc_info=exc, extra=fields)
    else:
        logger.info("Job %s (%s) cancelled on attempt %d of %d: %s", *head, what, extra=fields)


def _one_line(message: str) -> str:
    line = _LINE_BREAKS.sub(" ", text(message)).strip()
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."
