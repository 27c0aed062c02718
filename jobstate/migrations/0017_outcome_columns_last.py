"""Cheaper claims and outcomes (issue 9).

On PostgreSQL the columns the claim and the outcome write (``status``, the lease
token, the finish time, the result and the error) move to the end of the row,
just before the columns of running jobs that migration 0015 moved there, so that
neither write logs the job's parameters again (see ``jobstate.models.layout``).
As in 0015, only a table of at most ``MIGRATION_MAX_ROWS`` jobs is rewritten here
(a new install's is empty); a larger one is left as it is and ``manage.py
jobstate_move_hot_columns`` moves them when the operator chooses. The indexes
that name a moved column are built again. Nothing changes on SQLite, nor
backwards (the order means nothing to Django).
"""

from django.db import migrations

from jobstate.models import layout

# The order as of this migration (layout.WRITTEN_COLUMNS_LAST may change later;
# this migration keeps doing what it did).
WRITTEN_COLUMNS_LAST = (
    "status",
    "lease_token",
    "finished_at",
    "result",
    "error_type",
    "error_message",
    "traceback",
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


def move_written_columns_last(apps, schema_editor):  # type: ignore[no-untyped-def]
    outcome = layout.move_last(
        schema_editor.connection, "jobstate_job", WRITTEN_COLUMNS_LAST, max_rows=layout.MIGRATION_MAX_ROWS
    )
    if outcome.startswith(("skipped", "refused")):
        print(
            f"\n  jobstate: the columns that claims and outcomes write were not moved to the end of the"
            f" row ({outcome}).\n  Each claim and outcome logs the job's parameters again until"
            " `manage.py jobstate_move_hot_columns` moves them (docs/howto/upgrading.md)."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0016_time_ordered_ids"),
    ]

    operations = [
        migrations.RunPython(move_written_columns_last, migrations.RunPython.noop, elidable=False),
    ]
