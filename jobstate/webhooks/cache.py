"""This process's cached answer to "which events does any endpoint want?".

Kept apart from ``outbox`` (which reads endpoints) so that the endpoint model can
drop the answer when it changes without the two modules importing each other.
"""

from __future__ import annotations

import threading
import time

from django.db import transaction

_lock = threading.Lock()
_wanted: tuple[float, frozenset[str]] | None = None


def get() -> frozenset[str] | None:
    """The cached answer while it is fresh, else None."""
    cached = _wanted
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    return None


def put(answer: frozenset[str], ttl: float) -> None:
    global _wanted
    with _lock:
        _wanted = (time.monotonic() + ttl, answer)


def forget() -> None:
    """Drop the cached answer (an endpoint changed)."""
    global _wanted
    with _lock:
        _wanted = None


def changed(using: str | None = None) -> None:
    """An endpoint changed in the current transaction on ``using``: drop the answer
    now, for the rest of this transaction, and again once it commits, since another
    thread may have cached the committed rows in between."""
    forget()
    transaction.on_commit(_committed, using=using, robust=True)


def _committed() -> None:
    forget()


def uncommitted(using: str | None = None) -> bool:
    """Whether the transaction open on ``using`` changed an endpoint (``changed``) and
    has not committed: what it reads then, a rollback may undo, so it is not cached
    for the process. Django keeps ``_committed`` among the connection's commit
    callbacks until the commit, and drops it with a rollback (to a savepoint too):
    Django has no rollback callback to drop the answer with."""
    connection = transaction.get_connection(using)
    try:  # Django's entries are (savepoint ids, function, robust) in 5.2 and 6.x
        return any(entry[1] is _committed for entry in connection.run_on_commit)
    except (AttributeError, TypeError, IndexError):  # another layout: cache nothing in a transaction
        return bool(connection.in_atomic_block)
