"""This thread's database connection around a worker's writes: replaced when it
broke, a write made once more on a new one when the server had dropped it, closed
without a word (``close_quietly``), and a call on one that may no longer answer,
waited for a bounded time on a thread of its own (``on_own_thread``: a clean
exit's, ``at_exit``, and a given-up handler's outcome)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from django.db import Error as DatabaseErrors
from django.db import connection

from jobstate import conf

logger = logging.getLogger("jobstate.worker")
exit_logger = logging.getLogger("jobstate")

T = TypeVar("T")


def usable_connection(handler_seconds: float) -> bool:
    """Make sure the outcome can be stored: replace this thread's connection if
    the handler broke it (or, after a long run, if the server dropped it).
    Not unconditionally: with CONN_MAX_AGE=0 that would reconnect for every job.
    True if it was broken (closed here: the next query connects anew)."""
    if connection.connection is None or connection.in_atomic_block:
        return False
    broken = False
    if connection.errors_occurred or handler_seconds > 30:
        if not _usable():
            connection.close()
            broken = True
        connection.errors_occurred = False
    return broken


def _usable() -> bool:
    if not connection.is_usable():
        return False
    if connection.vendor != "sqlite":
        return True
    # Django's SQLite backend calls every connection usable; one closed at the
    # driver level (by a handler) raises on any use.
    try:
        connection.connection.total_changes  # noqa: B018
    except Exception:
        return False
    return True


def reconnecting(call: Callable[[], T], why: str) -> T:
    """``call`` (a worker's write), made once more on a new connection if the one
    it ran on turned out dead: the server ended it (a restart, a failover, an idle
    timeout, ``pg_terminate_backend``) and nothing had told Django. A connection
    that still answers (the call failed otherwise: a lock or statement timeout, a
    constraint) is not tried again, nor one that was new (the database is down),
    nor one in a transaction of the caller's: the error goes to the caller.
    ``call`` must be safe to repeat (a write guarded by the lease token is: one
    whose commit was lost with the connection is then refused). ``why``: logged."""
    kept = connection.connection
    if kept is None or connection.in_atomic_block:
        return call()
    try:
        return call()
    except DatabaseErrors:
        # Replaced already if the call's transaction could not be rolled back on it.
        if connection.connection is kept and not usable_connection(math.inf):
            raise
    logger.info("jobstate worker: %s; reconnected", why)
    return call()


# How often a write is tried again while the database does not answer.
UNANSWERED_RETRY_SECONDS = 0.5


def answers() -> bool:
    """Whether this thread's connection is open and answers (a failed connect leaves none)."""
    try:
        return connection.connection is not None and connection.is_usable()
    except Exception:
        return False


def until_answered(call: Callable[[], T], until: float, waiting: Callable[[BaseException], None]) -> T:
    """``call``, made again every ``UNANSWERED_RETRY_SECONDS`` while it fails because
    the database does not answer (a restart, a crash, a full ``max_connections``),
    until ``until`` (``time.monotonic()``); ``waiting(error)`` is told before each
    wait. An error from a database that answers (a constraint, a lock timeout) goes
    to the caller at once, as does the last one. ``call`` must be safe to repeat."""
    while True:
        try:
            return call()
        except DatabaseErrors as exc:
            if connection.in_atomic_block or answers():
                raise
            if time.monotonic() + UNANSWERED_RETRY_SECONDS > until:
                raise
            waiting(exc)
            close_quietly()
            time.sleep(UNANSWERED_RETRY_SECONDS)


class Calls(Generic[T]):
    """``call``, counting how often it was made (``reconnecting`` makes it twice
    when the first one's connection turned out dead: it may have committed there)."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.call, self.made = call, 0

    def __call__(self) -> T:
        self.made += 1
        return self.call()


# Set by jobstate.testing's drain inside a test's transaction: this thread's
# connection is the test's own, and closing it (after an interrupt) would end the
# test's transaction, every later query failing; it is left open.
keep_in_transaction: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jobstate_keep_in_transaction", default=False
)


def close_quietly() -> None:
    if keep_in_transaction.get() and connection.in_atomic_block:
        return
    with contextlib.suppress(Exception):
        connection.close()


def on_own_thread(call: Callable[[], None], *, name: str, seconds: float) -> bool:
    """``call()`` on a thread of its own (with its own connection, closed after),
    waited for ``seconds`` at most: a database that no longer answers (a network that
    drops packets) would hold the caller for the TCP timeout, minutes. False if it
    has not returned by then: it is left behind (a daemon thread)."""

    def run() -> None:
        try:
            call()
        finally:
            close_quietly()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def at_exit(remove: Callable[[str], None], name: str, *, what: str) -> None:
    """A clean exit's database call (``remove(name)``), waited for a heartbeat
    interval at most (``on_own_thread``), and the graceful stop with it; one still
    waiting is left behind as the process exits, the row to age."""

    def run() -> None:
        try:
            remove(name)
        except Exception:
            exit_logger.warning("jobstate: could not remove %s %s", what, name, exc_info=True)

    if not on_own_thread(run, name="jobstate-exit", seconds=float(conf.get("HEARTBEAT_SECONDS"))):
        exit_logger.warning("jobstate: the database did not answer in time; %s %s stays", what, name)
