"""The base of jobstate's migrations that lock a table: they wait for a lock a few seconds at most.

On PostgreSQL an ``ALTER TABLE``, a ``DROP INDEX`` or a ``CREATE INDEX`` waits for the
transactions that hold the table (a backup's ``pg_dump``, a long report, a session left
idle in a transaction), and every query of the table that comes after waits behind it in
the lock queue: workers, enqueues, the admin and the API stood still until that
transaction ended. Such a migration now gives up instead ("canceling statement due to
lock timeout", nothing applied); run ``migrate`` again once the long transaction ends.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# How long each statement of the migration waits for a lock (a migration keeps its
# own copy of any value it was written with: 0020 has its own).
LOCK_TIMEOUT = "5s"


class LockLimitedMigration(migrations.Migration):
    """A ``Migration`` that, on PostgreSQL and in its transaction, sets ``lock_timeout``."""

    def apply(self, project_state: Any, schema_editor: Any, collect_sql: bool = False) -> Any:
        limit_lock_waits(schema_editor)
        return super().apply(project_state, schema_editor, collect_sql)

    def unapply(self, project_state: Any, schema_editor: Any, collect_sql: bool = False) -> Any:
        limit_lock_waits(schema_editor)
        return super().unapply(project_state, schema_editor, collect_sql)


def limit_lock_waits(schema_editor: Any) -> None:
    # SET LOCAL ends with the migration's transaction (a migration not atomic has none).
    if schema_editor.connection.vendor == "postgresql" and schema_editor.atomic_migration:
        schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
