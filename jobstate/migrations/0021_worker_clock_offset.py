"""WorkerProcess.clock_offset: how far each process's clock is from the database's.

A nullable column without a default: on PostgreSQL a change of the catalogue
only (no table rewrite), on a small table written every few seconds.
"""

from django.db import migrations, models

from jobstate.migrations._lock_limited import LockLimitedMigration


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock
    dependencies = [
        ("jobstate", "0020_history_step_delivery_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="clock_offset",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
