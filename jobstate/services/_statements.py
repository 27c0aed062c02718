"""How the hot statements run: the writes every job makes (claim, begin,
progress, heartbeat, its outcome) with their history rows.

On PostgreSQL with psycopg 3 they run on a server-side-binding cursor of
Django's own connection (same session, same transaction) and, when the
connection allows prepared statements, each is prepared once per connection:
the server then parses and plans it once instead of on every call (measured:
a third less database CPU per job). Django turns prepared statements off by
default for the sake of connection poolers; a project turns them on with
``DATABASES[...]["OPTIONS"]["prepare_threshold"]`` (docs/howto/postgresql.md),
and jobstate follows that setting.

Elsewhere (SQLite, psycopg 2), and whenever Django records queries (DEBUG,
``assertNumQueries``) or an instrumentation wrapper is installed
(``connection.execute_wrapper``), they go through Django's own cursor, so that
what Django reports stays complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection

# The attribute of Django's connection wrapper (one per thread) that keeps the
# raw connection the cached cursor belongs to, and the cursor.
_CURSOR = "_jobstate_cursor"


def _direct() -> tuple[Any, bool] | None:
    """The server-binding cursor and whether to prepare, or None to use Django's cursor."""
    if connection.vendor != "postgresql" or connection.queries_logged or connection.execute_wrappers:
        return None
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "prepare_threshold"):
        return None  # psycopg 2
    cached = getattr(connection, _CURSOR, None)
    if cached is None or cached[0] is not raw:
        import psycopg

        cached = (raw, psycopg.Cursor(raw))
        setattr(connection, _CURSOR, cached)
    return cached[1], raw.prepare_threshold is not None


def prepared() -> bool:
    """Whether the hot statements are prepared on this thread's connection."""
    direct = _direct()
    return direct is not None and direct[1]


def execute(sql: str, params: Sequence[Any]) -> int:
    """Run one statement; return the number of rows it changed."""
    direct = _direct()
    if direct is None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
    cursor, prepare = direct
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        cursor.execute(sql, params, prepare=prepare)
        return int(cursor.rowcount)


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one statement that returns rows; return them."""
    direct = _direct()
    if direct is None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [tuple(row) for row in cursor.fetchall()]
    cursor, prepare = direct
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        cursor.execute(sql, params, prepare=prepare)
        return cursor.fetchall()
