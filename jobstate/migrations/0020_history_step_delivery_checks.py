"""CHECK constraints for invariants only Python guarded: both statuses of a history
row are statuses (its ``from`` may be empty: an enqueue's), a failed workflow step
has an error, and a delivery marked ok got a 2xx answer.

On PostgreSQL each is added ``NOT VALID`` (the table's exclusive lock for a
moment: the history table takes a row on every transition) and then validated in
its own transaction, which reads the existing rows while writes go on. A run that
stopped at a row breaking one (the error names the constraint) can be run again
once that row is fixed. On SQLite Django rebuilds each table, in a transaction.
"""

from typing import Any

from django.db import migrations, models, transaction

# How long the ADD waits for the table's exclusive lock. Queued behind a long
# transaction that reads the table, it would hold up every write to it (each
# transition's history row) until that transaction ended; it gives up instead (a
# "lock timeout" error: run ``migrate`` again later).
LOCK_TIMEOUT = "5s"


class AddCheck(migrations.AddConstraint):
    """``AddConstraint``; on PostgreSQL added ``NOT VALID``, then validated."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        connection = schema_editor.connection
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(connection.alias, model):
            return
        if connection.vendor != "postgresql":
            with transaction.atomic(using=connection.alias):
                super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        table, name = model._meta.db_table, self.constraint.name
        with transaction.atomic(using=connection.alias):
            schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            if not _exists(schema_editor, table, name):  # left NOT VALID by a run that stopped
                schema_editor.execute(f"{self.constraint.create_sql(model, schema_editor)} NOT VALID")
        qn = schema_editor.quote_name
        schema_editor.execute(f"ALTER TABLE {qn(table)} VALIDATE CONSTRAINT {qn(name)}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        with transaction.atomic(using=schema_editor.connection.alias):
            super().database_backwards(app_label, schema_editor, from_state, to_state)


def _exists(schema_editor: Any, table: str, name: str) -> bool:
    if schema_editor.collect_sql:  # sqlmigrate: print the statements
        return False
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s", [table, name]
        )
        return cursor.fetchone() is not None


class Migration(migrations.Migration):
    # Each constraint in its own transactions (see AddCheck).
    atomic = False

    dependencies = [
        ("jobstate", "0019_drop_actor_like_index"),
    ]

    operations = [
        AddCheck(
            model_name="jobevent",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "from_status__in",
                        [
                            "",
                            "queued",
                            "processing",
                            "waiting",
                            "completed",
                            "partial",
                            "failed",
                            "cancelled",
                        ],
                    ),
                    (
                        "to_status__in",
                        ["queued", "processing", "waiting", "completed", "partial", "failed", "cancelled"],
                    ),
                ),
                name="jobstate_event_statuses_valid",
            ),
        ),
        AddCheck(
            model_name="jobstep",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("status", "failed"), _negated=True),
                    models.Q(("error_message", ""), _negated=True),
                    _connector="OR",
                ),
                name="jobstate_step_failed_has_error",
            ),
        ),
        AddCheck(
            model_name="webhookdelivery",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("ok", False),
                    models.Q(
                        ("status_code__gte", 200), ("status_code__isnull", False), ("status_code__lte", 299)
                    ),
                    _connector="OR",
                ),
                name="jobstate_delivery_ok_is_2xx",
            ),
        ),
    ]
