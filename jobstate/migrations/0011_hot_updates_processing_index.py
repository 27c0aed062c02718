"""Cheap hot writes (issue 9): no index on a column written while a job runs.

Progress, heartbeats, lease renewal and begin write ``progress``,
``progress_message``, ``current_step``, ``heartbeat_at``, ``lease_expires_at``,
``updated_at``, ``started_at``, ``attempts`` and ``worker_id`` (``Job.HOT_COLUMNS``).
The three partial indexes on ``lease_expires_at``, ``heartbeat_at`` and
``started_at`` over the processing set made every such update write an entry
into every index of the table; they give way to one partial index on the
processing set keyed by ``kind`` (which never changes), which the reaper,
stuck detection and the per-kind concurrency count scan. The owner foreign key
loses its own index (two composite indexes lead with ``owner_id``). On PostgreSQL the
table also gets ``fillfactor`` 85, so an updated row version finds room on
its own page (a HOT update needs that).
"""

from django.conf import settings
from django.db import migrations, models

import jobstate.models.job

FILLFACTOR = 85


def fillfactor(apps, schema_editor, value=FILLFACTOR):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE jobstate_job SET (fillfactor = {int(value)})")


def default_fillfactor(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobstate_job RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0010_waiting_status_step_fsm_asset_attempt"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_lease_idx",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_heartbeat_idx",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_running_idx",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "processing")),
                fields=["kind"],
                name="jobstate_job_processing_idx",
            ),
        ),
        # owner_id leads jobstate_job_owner_idx and jobstate_job_owner_new_idx.
        migrations.AlterField(
            model_name="job",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=jobstate.models.job.forget_owner,
                related_name="jobstate_jobs",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(fillfactor, default_fillfactor, elidable=False),
    ]
