"""Exceptions raised by the service layer and by handlers."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError


class JobStateError(Exception):
    """Base class for every jobstate error."""


# What the transitions an operator asks for need of the job: the second half of
# their refusal ("the job is queued; only a finished job can be retried").
NEEDED = {
    "cancel": "only a queued, waiting or running job can be cancelled",
    "force_cancel": (
        "only a running job whose cancel was requested can be cancelled now on behalf of its worker"
    ),
    "retry": "only a finished job can be retried",
    "requeue": "only a running or waiting job can be requeued",
    "wake": "only a running or waiting job can be requeued",  # a waiting job's requeue
    "fail": "only a queued, waiting or running job can be failed",
    "stop": "only a queued, waiting or running job can be stopped",
    "retry_from": "only a finished workflow can be retried",
    "skip_step": "only a step of a queued or waiting workflow can be skipped",
}


class InvalidTransition(JobStateError):
    """The job's current state does not allow the requested transition."""

    def __init__(self, current: str, requested: str, transition: str = "") -> None:
        self.current = current
        self.requested = requested
        self.transition = transition
        via = f" ({transition})" if transition else ""
        super().__init__(f"Cannot move job from '{current}' to '{requested}'{via}")

    @property
    def refusal(self) -> str:
        """Why, as the admin, the REST API and ``manage.py jobstate`` tell an operator:
        "the job is queued; only a finished job can be retried" (the message itself for
        a transition no operator asks for)."""
        needed = NEEDED.get(self.transition)
        return f"the job is {self.current}; {needed}" if needed else str(self)


class LeaseLost(JobStateError):
    """The caller's lease token no longer owns the job; nothing was written."""

    def __init__(self, job_id: object, reason: str = "lease token does not match") -> None:
        self.job_id = job_id
        self.reason = reason
        super().__init__(f"Lease lost on job {job_id}: {reason}")


class DuplicateActiveKey(JobStateError):
    """Another active job already holds this (kind, key)."""


class KeyReused(JobStateError):
    """An idempotency key names a job enqueued with other work: its cleaned
    parameters or its priority (``fields``) differ from the request's
    (``get_or_enqueue(match_request=True)``, the REST API's 422). Nothing was written."""

    def __init__(self, job_id: object, kind: str, key: str, fields: tuple[str, ...]) -> None:
        self.job_id = job_id
        self.kind = kind
        self.key = key
        self.fields = fields
        super().__init__(
            f"Key '{key}' already names '{kind}' job {job_id}, which was enqueued with other "
            f"{' and '.join(fields)}: use a new key for new work."
        )


class RangeNotSatisfiable(JobStateError):
    """A download's ``Range`` selects no byte of the file (it starts at or past its
    end, or is a suffix of 0 bytes): answered 416 with ``content_range``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.content_range = f"bytes */{size}"
        super().__init__(f"The requested range is not satisfiable: the file has {size} bytes.")


class UnservableFile(JobStateError):
    """An asset's stored file is not one to serve: its name is not inside its job's
    own folder of the storage (another job's file, another app's, ``..``, absolute:
    a hand-edited or old row). Its download is a 404, as for a missing file."""

    def __init__(self, asset_id: object) -> None:
        self.asset_id = asset_id
        super().__init__("The asset's file cannot be served.")


class AlreadyRetried(JobStateError):
    """A job is retried once: this one has a retry already (``retry_of`` names it);
    retry that one, or its own retry, instead."""

    def __init__(self, job_id: object, retry_id: object) -> None:
        self.job_id = job_id
        self.retry_id = retry_id
        super().__init__(f"Job {job_id} was already retried as job {retry_id}: retry that one instead.")


class ParentEnded(JobStateError):
    """A child cannot be queued under a parent that failed, was cancelled, or is
    being cancelled: that parent ended its children (``services.cascade``)."""

    def __init__(self, parent_id: object, status: str) -> None:
        self.parent_id = parent_id
        self.status = status
        super().__init__(f"Its parent job {parent_id} is {status}: retry the parent instead.")


class ConcurrencyLimitReached(JobStateError):
    """A job of this kind cannot start now: as many as its concurrency limit run."""

    def __init__(self, kind: str, limit: int) -> None:
        self.kind = kind
        self.limit = limit
        super().__init__(f"{limit} job(s) of kind '{kind}' are running, its concurrency limit")


class KindPaused(JobStateError):
    """A job of this kind cannot start now: an operator paused the kind
    (``services.pause_kind``); it stays queued until the kind is resumed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(f"Kind '{kind}' is paused: its jobs stay queued until it is resumed")


class PauseRefused(JobStateError):
    """A pause of a kind already paused, or a resume of a kind that is not paused;
    nothing was written. ``refusal`` says why, as the admin and ``manage.py
    jobstate`` tell an operator."""

    def __init__(self, kind: str, refusal: str) -> None:
        self.kind = kind
        self.refusal = refusal
        super().__init__(refusal)


class StepStateError(JobStateError):
    """The workflow step is not in a state that allows the requested change; nothing was written."""

    def __init__(self, job_id: object, name: str, requested: str, current: str | None = None) -> None:
        self.job_id = job_id
        self.name = name
        self.current = current
        super().__init__(f"Step '{name}' of job {job_id} is {current or 'missing'}; cannot {requested}")


class CancelRequested(JobStateError):
    """A cancel was requested: the handler must stop; the worker ends the job ``cancelled``."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"Cancel requested for job {job_id}")


class UnknownKind(ValidationError):
    """No handler is registered under that name."""

    def __init__(self, kind: str) -> None:
        super().__init__({"kind": [f"Unknown job kind '{kind}'."]}, code="unknown_kind")
        self.kind = kind

    @property
    def retry_refusal(self) -> str:
        """Why a job of this kind cannot be retried (the REST API's and ``manage.py
        jobstate retry``'s message): its handler was removed from the code since."""
        return f"This job's kind '{self.kind}' is no longer registered: it cannot be retried."


class InvalidParameters(ValidationError):
    """Parameters failed the handler's schema. ``errors`` is the serializer's errors
    as plain data, the REST API's ``fields.parameters``: field to messages, a nested
    field to its own dict (a list's item by its index, as text). ``messages`` has one
    ``"path.to.field: message"`` per error."""

    def __init__(self, errors: Mapping[str, Any]) -> None:
        self.errors: dict[str, Any] = _plain(errors)
        super().__init__({"parameters": list(_lines(self.errors, ""))}, code="invalid_parameters")


def _plain(errors: Any) -> Any:
    """DRF's error tree (``ErrorDetail``, integer keys) as strings, lists and dicts.
    A nested serializer's list (``many=True``: one dict per item, empty if valid, in
    some DRF releases, 3.15.0 among them) becomes a dict by index of its invalid items,
    as later ones give it."""
    if isinstance(errors, Mapping):
        return {str(k): _plain(v) for k, v in errors.items()}
    if isinstance(errors, list | tuple):
        if any(isinstance(v, Mapping) for v in errors):
            return {str(i): _plain(v) for i, v in enumerate(errors) if v}
        return [_plain(v) for v in errors]
    return str(errors)


def _lines(errors: Any, path: str) -> Iterator[str]:
    if isinstance(errors, dict):
        for key, value in errors.items():
            yield from _lines(value, f"{path}.{key}" if path else key)
    elif isinstance(errors, list):
        # Messages, or one dict per item (empty if valid), as a validate() may raise.
        nested = any(isinstance(v, dict | list) for v in errors)
        for index, value in enumerate(errors):
            yield from _lines(value, f"{path}.{index}" if nested else path)
    else:
        yield f"{path}: {errors}" if path else errors


class Interrupted(BaseException):
    """Raised inside a running handler by its worker when the attempt must stop now
    (``why``: "timeout", "cancel" or "lease"). A ``BaseException`` so that a
    handler's ``except Exception`` cannot swallow it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class NonRetryable(Exception):
    """Raise (or subclass) in a handler to fail the job without further attempts."""


class Partial(Exception):
    """Raise from a handler to end the job ``partial`` with a result and an error."""

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result


class Suspend(Exception):
    """Raised by a handler (e.g. a workflow waiting for its children) to give the
    worker back: the job returns to the queue without spending an attempt, until
    ``until`` or, when None, until its last active child has ended."""

    def __init__(self, reason: str = "waiting", until: datetime | None = None) -> None:
        # Refused where the handler raises it (its attempt fails with this error),
        # not later in the worker, which could then store nothing.
        if until is not None and not isinstance(until, datetime):
            raise TypeError(f"Suspend(until=...) is a datetime or None, not {type(until).__name__}")
        if until is not None and settings.USE_TZ and until.utcoffset() is None:
            raise ValueError("Suspend(until=...) is a timezone-aware datetime (USE_TZ is on)")
        super().__init__(reason)
        self.reason = reason
        self.until = until


# SQLSTATEs that end a wait for a lock (the server answered): lock_not_available
# (lock_timeout), query_canceled (a statement_timeout shorter than the caller's, set
# on the server or the role), deadlock_detected.
LOCK_WAIT_STATES = frozenset({"55P03", "57014", "40P01"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error as Django raises it (its own class, the
    driver's error as the cause): psycopg 3 names it ``sqlstate``, psycopg2 ``pgcode``."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def waited_on_a_lock(exc: BaseException) -> bool:
    """Did this database error end a wait for a lock (PostgreSQL's lock_timeout,
    SQLite's busy timeout), as opposed to a connection that failed?"""
    return sqlstate(exc) in LOCK_WAIT_STATES or _sqlite_locked(exc)


# SQLSTATEs of contention between transactions, which the same request may get past
# when tried again: lock_not_available (lock_timeout), deadlock_detected,
# serialization_failure.
CONTENTION_STATES = frozenset({"55P03", "40P01", "40001"})


def contended(exc: BaseException) -> bool:
    """Did this database error come from other transactions holding what it needed
    (PostgreSQL's lock timeout, deadlock or serialization failure; SQLite's
    "database is locked"), rather than from a failed connection or a bug?"""
    return sqlstate(exc) in CONTENTION_STATES or _sqlite_locked(exc)


def _sqlite_locked(exc: BaseException) -> bool:
    message = str(exc)
    return "database is locked" in message or "database table is locked" in message


# SQLSTATEs of a connection the server refused or ended, besides class 08
# (connection_exception): admin_shutdown (pg_terminate_backend, a fast or smart
# shutdown), crash_shutdown, cannot_connect_now (the server is starting or stopping).
DISCONNECTION_STATES = frozenset({"57P01", "57P02", "57P03"})


# A connection the server refuses for its settings (a wrong database, role or password):
# no SQLSTATE reaches the driver at connect time, yet retrying cannot help. A bug, not
# an outage: it stays a 500, logged with its traceback.
MISCONFIGURED = ("does not exist", "authentication failed", "no password supplied", "pg_hba.conf")


def disconnected(exc: BaseException) -> bool:
    """Did this ``OperationalError`` or ``InterfaceError`` come from the connection
    rather than the query: the server refused or ended it (PostgreSQL down, restarting,
    failing over), or none could be made? The server's errors say so by their SQLSTATE;
    the driver's own have none: an ``OperationalError`` (a refused or lost connection,
    a pool that gave none in time) unless the server refused the settings
    (``MISCONFIGURED``), and an ``InterfaceError`` only for a closed connection
    ("the connection is closed", psycopg2's "connection already closed"; "the cursor is
    closed" is a bug). SQLite's never have one, and are not a connection's ("disk I/O
    error", "no such table"): not counted."""
    state = sqlstate(exc)
    if state is not None:
        return state.startswith("08") or state in DISCONNECTION_STATES
    error = exc.__cause__ or exc
    if isinstance(error, sqlite3.Error):
        return False
    message = str(exc).lower()
    if any(part in message for part in MISCONFIGURED):
        return False
    if type(exc).__name__ == "InterfaceError":
        return "connection" in message and "closed" in message
    return True
