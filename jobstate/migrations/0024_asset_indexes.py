"""Asset indexes: one for the files of lost attempts, two fewer that others cover.

The asset admin's "Lost attempts" filter lists the files of lost attempts; they are
rare, so without an index of their own the filter read the whole asset table (about
a second for 2 million assets), and the partial index costs no write for the others.
``job`` and ``owner`` lose their single-column indexes: ``jobstate_asset_job_idx``
(job, created_at) and ``jobstate_asset_owner_idx`` (owner, -created_at) lead with
them and serve every lookup by either, so each file stored wrote two index entries
that nothing read. They are dropped by name, so that the foreign keys stay (an
AlterField would drop and re-add them, locking and re-checking both tables), after
the new index is built: a DROP INDEX locks the table against reads too until the
migration commits.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from jobstate.migrations._lock_limited import LockLimitedMigration


def _drop_fk_index(name, field, column, index):
    return migrations.SeparateDatabaseAndState(
        state_operations=[migrations.AlterField(model_name="asset", name=name, field=field)],
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX "{index}" ON "jobstate_asset" ("{column}")',
            ),
        ],
    )


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock
    dependencies = [
        ("jobstate", "0023_status_index_without_processing"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The new index first: its build holds the table's writes only, and the drops
        # after it take their exclusive lock just before the migration commits.
        migrations.AddIndex(
            model_name="asset",
            index=models.Index(
                condition=models.Q(("attempt_lost", True)),
                fields=["-created_at"],
                name="jobstate_asset_lost_idx",
            ),
        ),
        _drop_fk_index(
            "job",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="assets",
                to="jobstate.job",
            ),
            "job_id",
            "jobstate_asset_job_id_fbe1e004",
        ),
        _drop_fk_index(
            "owner",
            models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="jobstate_assets",
                to=settings.AUTH_USER_MODEL,
            ),
            "owner_id",
            "jobstate_asset_owner_id_e8e5f3b6",
        ),
    ]
