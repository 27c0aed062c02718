"""Cheaper job writes (issue 9), second part.

On PostgreSQL the columns written while a job runs move to the end of the row,
next to each other, so that a progress write logs a few bytes of WAL instead of
most of the row (see ``jobstate.models.layout``). Moving them rewrites every
row under an exclusive lock, so this migration moves them only in a table of at
most ``MIGRATION_MAX_ROWS`` jobs (a new install's is empty); a larger one is
left as it is and ``manage.py jobstate_move_hot_columns`` moves them when the
operator chooses. Nothing changes on SQLite, nor backwards (the order means
nothing to Django).

The status index then leaves completed jobs out: they are most of any table,
the created_at index lists them newest first as fast, and so the outcome of
most jobs writes one index entry fewer.
"""

from django.db import migrations, models

from jobstate.models import layout

# The columns and their order as of this migration (layout.HOT_COLUMNS_LAST may
# change later; this migration keeps doing what it did).
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


def move_hot_columns_last(apps, schema_editor):  # type: ignore[no-untyped-def]
    outcome = layout.move_last(
        schema_editor.connection, "jobstate_job", HOT_COLUMNS_LAST, max_rows=layout.MIGRATION_MAX_ROWS
    )
    if outcome.startswith(("skipped", "refused")):
        print(
            f"\n  jobstate: the columns of running jobs were not moved to the end of the row ({outcome})."
            "\n  Progress writes log about twice the WAL until `manage.py jobstate_move_hot_columns`"
            " moves them (docs/howto/upgrading.md)."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0014_cheaper_job_writes"),
    ]

    operations = [
        migrations.RunPython(move_hot_columns_last, migrations.RunPython.noop, elidable=False),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_status_idx",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "completed"), _negated=True),
                fields=["status", "-created_at"],
                name="jobstate_job_status_idx",
            ),
        ),
    ]
