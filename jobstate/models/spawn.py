"""The spawns a workflow step's iteration stored with its checkpoints, one row each."""

from __future__ import annotations

from django.db import models


class JobStepSpawn(models.Model):
    """A child job that a step asked for (``ctx.spawn``) while walking its items with
    ``ctx.iterate``/``ctx.batches``, stored by the checkpoint that moved past its item
    and not started yet (``jobstate.workflows.spawns``). Each checkpoint adds the rows of
    the spawns made since the one before (it never rewrites the earlier ones); the step
    deletes them when it starts its children, and deleting the job deletes them.
    Written by ``jobstate.workflows.steps`` and ``step_waits`` only."""

    # Keyed by the job, not the step row: deleting jobs (retention) deletes these
    # rows with one statement, and the steps' rows stay deleted without being read.
    job = models.ForeignKey("jobstate.Job", on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.CharField(max_length=200)
    position = models.PositiveIntegerField(help_text="The spawn's place in the iteration's spawns, from 0.")
    kind = models.CharField(max_length=200)
    parameters = models.JSONField(default=dict, blank=True)
    options = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("job", "step", "position")
        constraints = [
            # Its index serves every lookup: by job (deletes), by job and step, in order.
            models.UniqueConstraint(fields=["job", "step", "position"], name="jobstate_step_spawn_position"),
        ]

    def __str__(self) -> str:
        return f"{self.step} #{self.position}: {self.kind}"
