"""A transaction the handler left open: found and rolled back before its job's
outcome is written (``runner.run_job``), which would otherwise be written inside
that transaction, never committed, and so would every later job of this worker
process."""

from __future__ import annotations

import logging

from django.db import connection

from jobstate.exceptions import NonRetryable
from jobstate.worker.connections import close_quietly

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
