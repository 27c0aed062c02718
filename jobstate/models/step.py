"""Durable steps of a workflow job (written only by jobstate.workflows.steps)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for children"
    SERVING = "serving", "Serving"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"
    UNDONE = "undone", "Undone"


# A step in one of these has finished (for now): it carries ``finished_at``.
STEP_FINISHED = (StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.UNDONE)
# A later step may start once every earlier step is in one of these.
STEP_DONE = (StepStatus.COMPLETED, StepStatus.SKIPPED)


class JobStep(models.Model):
    job = models.ForeignKey("jobstate.Job", on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    cursor = models.JSONField(null=True, blank=True, help_text="Last checkpoint inside the step.")
    output = models.JSONField(null=True, blank=True, help_text="What the step returned.")
    error_message = models.TextField(blank=True, default="")
    detail = models.JSONField(
        default=dict,
        blank=True,
        help_text="Bookkeeping: child jobs of a fan-out, who skipped the step and why, undo outcome.",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("job", "position")
        constraints = [
            models.UniqueConstraint(fields=["job", "position"], name="jobstate_step_position"),
            models.UniqueConstraint(fields=["job", "name"], name="jobstate_step_name"),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="jobstate_step_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status__in=STEP_FINISHED) | Q(finished_at__isnull=False),
                name="jobstate_step_finished_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.position}. {self.name} [{self.status}]"
