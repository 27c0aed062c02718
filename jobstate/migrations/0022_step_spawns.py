"""JobStepSpawn: the spawns a workflow step's iteration stored with its checkpoints,
one row each (``jobstate.workflows.spawns``). Each checkpoint adds the rows of the
spawns made since the one before; they were a list in the step's ``detail``
(``"spawned"``), rewritten whole at every checkpoint.

Steps that stored such a list before keep it: the new release reads it as it is.
Going back writes the rows of each step still holding them into that list again
(the older release reads nothing else), before the table goes.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

from jobstate.migrations._lock_limited import LockLimitedMigration

SPAWNED = "spawned"


def back_to_lists(apps: Any, schema_editor: Any) -> None:
    JobStep = apps.get_model("jobstate", "JobStep")
    JobStepSpawn = apps.get_model("jobstate", "JobStepSpawn")
    alias = schema_editor.connection.alias
    steps = JobStep.objects.using(alias).filter(detail__has_key=SPAWNED)
    for step in steps.iterator(chunk_size=100):
        entry = step.detail[SPAWNED]
        if not isinstance(entry, dict) or "children" in entry:
            continue
        rows = JobStepSpawn.objects.using(alias).filter(
            job_id=step.job_id, step=step.name, position__lt=entry.get("count", 0)
        )
        children = [list(r) for r in rows.order_by("position").values_list("kind", "parameters", "options")]
        step.detail = {**step.detail, SPAWNED: {"at": entry.get("at"), "children": children}}
        step.save(update_fields=["detail"])


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock
    dependencies = [
        ("jobstate", "0021_worker_clock_offset"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStepSpawn",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("step", models.CharField(max_length=200)),
                (
                    "position",
                    models.PositiveIntegerField(
                        help_text="The spawn's place in the iteration's spawns, from 0."
                    ),
                ),
                ("kind", models.CharField(max_length=200)),
                ("parameters", models.JSONField(blank=True, default=dict)),
                ("options", models.JSONField(blank=True, default=dict)),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="jobstate.job",
                    ),
                ),
            ],
            options={
                "ordering": ("job", "step", "position"),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "step", "position"), name="jobstate_step_spawn_position"
                    )
                ],
            },
        ),
        # Reversed before the table is dropped.
        migrations.RunPython(migrations.RunPython.noop, back_to_lists, elidable=False),
    ]
