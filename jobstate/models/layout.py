"""Where the columns a job's writes change sit in ``jobstate_job`` (PostgreSQL).

An update whose new row version stays on its page logs only the bytes between
the first and the last column it changed (PostgreSQL compresses the common
prefix and suffix of the two versions, unless ``wal_level`` is ``logical`` or
the page needs a full image). A progress write changes ``progress``, its message,
the heartbeat, the lease expiry and ``updated_at``: spread over the row, each
write logged about 200 bytes of WAL; side by side at the end of the row, about
110. The claim and the outcome also change ``status``, the lease token, the
finish time, the result and the error: placed just before those, after the
parameters, so that neither logs the job's parameters again (with 500 bytes of
parameters, a claim and its outcome logged about 1,800 bytes of WAL with
``status`` at the start of the row, and 770 with it at the end:
``bench/experiments/row_order.py``).

PostgreSQL cannot reorder columns, so each column moves: renamed aside, added
again at the end with the same type, copied, and the old one dropped, with the
CHECK constraints and the indexes that named it made again. That rewrites every
row (and rebuilds those indexes) once under an exclusive lock, so migrations 0015
and 0017 do it only on a small table (a new install's is empty) and ``manage.py
jobstate_move_hot_columns`` does it on a large one when the operator chooses.
Anything else attached to a column (a constraint other than a CHECK, a comment,
a view, column privileges, options or statistics), a rebuilt index's own settings,
and the table's triggers and rules (the copy would fire them) would be lost or
changed, and a publication's subscribers would get the copy with columns they lack:
then nothing is moved, and the objects are named (``attached``).
"""

from __future__ import annotations

from typing import Any

# Job.HOT_COLUMNS, in the order they end the row: first those written once per
# attempt (begin), then those every progress write changes, the variable-length
# ones last so that a message of another length shifts nothing after it.
HOT_COLUMNS_LAST = (
    "worker_id",
    "attempts",
    "started_at",
    "lease_expires_at",
    "heartbeat_at",
    "updated_at",
    "progress",
    "progress_message",
    "current_step",
)
# What the claim and the outcome write besides those, in the order they precede them.
OUTCOME_COLUMNS = (
    "status",
    "lease_token",
    "finished_at",
    "result",
    "error_type",
    "error_message",
    "traceback",
)
# The end of the row, as migration 0017 and the command leave it.
WRITTEN_COLUMNS_LAST = OUTCOME_COLUMNS + HOT_COLUMNS_LAST
TABLE = "jobstate_job"
# Migrations 0015 and 0017 move the columns of a table with at most this many rows.
MIGRATION_MAX_ROWS = 10_000


def column_order(connection: Any, table: str = TABLE) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
            [table],
        )
        return [name for (name,) in cursor.fetchall()]


def in_place(connection: Any, table: str = TABLE, columns: tuple[str, ...] = WRITTEN_COLUMNS_LAST) -> bool:
    """Whether ``columns`` end the row, in this order."""
    return column_order(connection, table)[-len(columns) :] == list(columns)


def attached(connection: Any, table: str, columns: tuple[str, ...]) -> list[str]:
    """What a move would lose or change: anything on ``columns`` but CHECK
    constraints and plain indexes, which it makes again (other constraints,
    defaults, views, statistics objects, comments, column privileges, options,
    storage, compression, statistics targets, collations); a rebuilt index's or
    CHECK's own settings (tablespace, replica identity, cluster mark, comment); and
    the table's triggers and rules, which the copying UPDATE would fire; and the
    publications that hold the table, whose subscribers would get the copy."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attnum, attname, attacl IS NOT NULL, attstattarget > 0,"
            " attcollation <> (SELECT typcollation FROM pg_type WHERE oid = atttypid),"
            # The planner's per-column options (other entries may be the server's own).
            " EXISTS (SELECT 1 FROM unnest(attoptions) o WHERE o LIKE 'n\\_distinct%%'),"
            " attstorage <> (SELECT typstorage FROM pg_type WHERE oid = atttypid),"
            " attcompression <> ''"
            " FROM pg_attribute WHERE attrelid = %s::regclass AND attname = ANY(%s) AND NOT attisdropped",
            [table, list(columns)],
        )
        rows = cursor.fetchall()
        found = [
            f"{what} on {name}"
            for _, name, *present in rows
            for what, there in zip(
                (
                    "column privileges",
                    "a statistics target",
                    "a collation",
                    "column options",
                    "a storage setting",
                    "a compression setting",
                ),
                present,
                strict=True,
            )
            if there
        ]
        numbers = [row[0] for row in rows]
        cursor.execute(
            "SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend"
            " WHERE refclassid = 'pg_class'::regclass AND refobjid = %s::regclass AND refobjsubid = ANY(%s)"
            " AND NOT (classid = 'pg_constraint'::regclass"
            "  AND objid IN (SELECT oid FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'))"
            " AND NOT (classid = 'pg_class'::regclass AND objid IN (SELECT indexrelid FROM pg_index"
            "  WHERE indrelid = %s::regclass AND indexrelid NOT IN (SELECT conindid FROM pg_constraint)))"
            " UNION SELECT 'comment on column ' || objsubid FROM pg_description"
            " WHERE classoid = 'pg_class'::regclass AND objoid = %s::regclass AND objsubid = ANY(%s)",
            [table, numbers, table, table, table, numbers],
        )
        found += sorted(name for (name,) in cursor.fetchall())
        # What a rebuilt index or CHECK would not take with it.
        cursor.execute(
            "SELECT c.relname, c.reltablespace <> 0, i.indisreplident, i.indisclustered,"
            " obj_description(i.indexrelid, 'pg_class') IS NOT NULL,"
            " EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass AND i.indexrelid IN (SELECT objid FROM pg_depend"
            "  WHERE classid = 'pg_class'::regclass AND refobjid = %s::regclass AND refobjsubid = ANY(%s))",
            [table, table, numbers],
        )
        found += [
            f"{what} of index {name}"
            for name, *present in cursor.fetchall()
            for what, there in zip(INDEX_SETTINGS, present, strict=True)
            if there
        ]
        cursor.execute(
            "SELECT 'comment on constraint ' || conname FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c' AND conkey && %s::smallint[]"
            " AND obj_description(oid, 'pg_constraint') IS NOT NULL"
            " UNION SELECT 'trigger ' || tgname FROM pg_trigger"
            " WHERE tgrelid = %s::regclass AND NOT tgisinternal"
            " UNION SELECT 'rule ' || rulename FROM pg_rewrite WHERE ev_class = %s::regclass"
            " AND rulename <> '_RETURN'"
            # Logical replication decodes the copy with the columns renamed aside, which a
            # subscriber's table lacks: its apply would stop there.
            " UNION SELECT 'publication ' || t.pubname FROM pg_publication_tables t"
            " JOIN pg_namespace n ON n.nspname = t.schemaname"
            " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename"
            " WHERE c.oid = %s::regclass",
            [table, numbers, table, table, table],
        )
        found += sorted(name for (name,) in cursor.fetchall())
    return found


# What a rebuilt index would lose (pg_get_indexdef gives none of them).
INDEX_SETTINGS = (
    "a tablespace",
    "the replica identity",
    "the cluster mark",
    "a comment",
    "a statistics target",
)


def _refusal(connection: Any, table: str, columns: tuple[str, ...], max_rows: int | None) -> str | None:
    """Why nothing moves ("in place", "refused: ...", "skipped: ..."), or None."""
    if in_place(connection, table, columns):
        return "in place"
    lost = attached(connection, table, columns)
    if lost:
        return "refused: " + "; ".join(lost)
    if max_rows is not None:
        with connection.cursor() as cursor:
            qn = connection.ops.quote_name
            cursor.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM {qn(table)} LIMIT %s) t", [max_rows + 1])
            (rows,) = cursor.fetchone()
        if rows > max_rows:
            return f"skipped: more than {max_rows} rows"
    return None


# How long a migration waits for the table (a long query holds it): then it moves
# nothing, as on a large table, instead of stalling every query queued behind it.
MIGRATION_LOCK_WAIT = "2s"


def move_last(
    connection: Any,
    table: str = TABLE,
    columns: tuple[str, ...] = WRITTEN_COLUMNS_LAST,
    *,
    max_rows: int | None = None,
    lock_wait: str | None = None,
) -> str:
    """Move ``columns`` to the end of ``table``'s rows, in this order; returns what
    happened: "moved", "in place", "skipped: ..." (more than ``max_rows`` rows, or
    the table busy for ``lock_wait``, a PostgreSQL interval such as "2s": with
    ``max_rows`` (a migration) MIGRATION_LOCK_WAIT unless given, else no limit) or
    "refused: ..." (objects the move would lose). Runs in the caller's transaction,
    which it must be inside of; does nothing but on PostgreSQL. The exclusive lock
    is taken only for a move, and everything is checked again under it."""
    if connection.vendor != "postgresql":
        return "in place"
    qn = connection.ops.quote_name
    early = _refusal(connection, table, columns, max_rows)
    if early is not None:
        return early
    with connection.cursor() as cursor:
        wait = lock_wait or (MIGRATION_LOCK_WAIT if max_rows is not None else None)
        if wait is None:
            cursor.execute(f"LOCK TABLE {qn(table)} IN ACCESS EXCLUSIVE MODE")
        elif not _lock_briefly(connection, table, wait):
            return f"skipped: the table was in use for {wait}"
        early = _refusal(connection, table, columns, max_rows)
        if early is not None:
            return early
        cursor.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = ANY(%s) AND NOT attisdropped",
            [table, list(columns)],
        )
        definitions = {name: (kind, not_null) for name, kind, not_null in cursor.fetchall()}
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass"
            " AND contype = 'c' AND conkey && (SELECT array_agg(attnum) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = ANY(%s))",
            [table, table, list(columns)],
        )
        checks = cursor.fetchall()
        # Indexes (a unique constraint with a condition is one) go with the column
        # they name when it is dropped: their definitions, taken before the renames.
        cursor.execute(
            "SELECT DISTINCT pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass AND d.refobjid = %s::regclass AND d.refobjsubid IN"
            "  (SELECT attnum FROM pg_attribute WHERE attrelid = %s::regclass AND attname = ANY(%s))",
            [table, table, table, list(columns)],
        )
        indexes = [definition for (definition,) in cursor.fetchall()]
        for name in columns:
            cursor.execute(f"ALTER TABLE {qn(table)} RENAME COLUMN {qn(name)} TO {qn(name + '__moving')}")
        adds = ", ".join(f"ADD COLUMN {qn(name)} {definitions[name][0]}" for name in columns)
        cursor.execute(f"ALTER TABLE {qn(table)} {adds}")
        copies = ", ".join(f"{qn(name)} = {qn(name + '__moving')}" for name in columns)
        cursor.execute(f"UPDATE {qn(table)} SET {copies}")
        changes = [f"DROP COLUMN {qn(name + '__moving')}" for name in columns]
        changes += [f"ALTER COLUMN {qn(name)} SET NOT NULL" for name in columns if definitions[name][1]]
        changes += [f"ADD CONSTRAINT {qn(name)} {definition}" for name, definition in checks]
        cursor.execute(f"ALTER TABLE {qn(table)} {', '.join(changes)}")
        for definition in indexes:
            cursor.execute(definition)
        cursor.execute(f"ANALYZE {qn(table)}")
    return "moved"


def _lock_briefly(connection: Any, table: str, wait: str) -> bool:
    """The exclusive lock within ``wait``, or False (nothing held)."""
    from django.db import OperationalError, transaction

    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (before,) = cursor.fetchone()
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [wait])
            cursor.execute(f"LOCK TABLE {qn(table)} IN ACCESS EXCLUSIVE MODE")
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])
    except OperationalError:
        return False
    return True
