"""The index of a job's parent becomes ``(parent, status)``, still holding only the
jobs that have a parent (a job without one writes no entry, as before).

The fan-in's "is any child still active?" after each child's outcome read every
child of the parent until it met an active one (on a fan-out of 100,000, most of
them once the fan-out drains); it now reads the active children's entries only,
as the cancel cascade does. The admin counts a parent's children by status from
the index alone. The new index is built before the old one is dropped: its build
holds the table's writes only, and the drop takes its exclusive lock just before
the migration commits.
"""

from django.db import migrations, models

from jobstate.migrations._lock_limited import LockLimitedMigration


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock
    dependencies = [
        ("jobstate", "0025_webhook_answerable"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent", "status"],
                name="jobstate_job_parent_status_idx",
            ),
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_parent_idx",
        ),
    ]
