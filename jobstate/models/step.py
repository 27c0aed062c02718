"""Durable steps of a workflow job and their state machine, declared once with django-fsm-2.

Status changes go through ``jobstate.services.steps.move_step`` (a guarded UPDATE
plus a history row on the job, in one transaction); other columns (cursor, detail)
are written by ``jobstate.workflows.steps``, ``step_waits`` and ``step_undos``."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import FSMField, FSMModelMixin, transition

from jobstate.states import TERMINAL


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


S = StepStatus
# Where a run (re)starts a step: a crashed run leaves it running or serving.
RUNNABLE = (S.PENDING, S.RUNNING, S.FAILED, S.SERVING)
# A step a worker is in the middle of.
STEP_BUSY = (S.RUNNING, S.SERVING, S.WAITING)

# How a step is shown (``workflows.state``, the REST API, the admin): a step still
# busy in a job that ended (cancelled, or failed by the reaper or an operator while
# the step was in progress) is ``interrupted``; no worker will finish it. Read-side
# only: the stored row keeps its status (the step's history stays as it happened).
INTERRUPTED = "interrupted"
SHOWN_STEP_STATUS: list[tuple[str, str]] = [*StepStatus.choices, (INTERRUPTED, "Interrupted")]


def shown_status(step_status: str, job_status: str) -> str:
    """The status to show for a step stored as ``step_status`` in a job in ``job_status``."""
    return INTERRUPTED if job_status in TERMINAL and step_status in STEP_BUSY else step_status


class JobStep(FSMModelMixin, models.Model):
    job = models.ForeignKey("jobstate.Job", on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=200)
    status = FSMField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
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
            models.CheckConstraint(
                condition=~Q(status=StepStatus.FAILED) | ~Q(error_message=""),
                name="jobstate_step_failed_has_error",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.position}. {self.name} [{self.status}]"

    # The step state machine. As for ``Job``, these methods are the declaration
    # that jobstate.services.steps reads as a table (sources -> target) and turns
    # into a guarded UPDATE; never call them directly.

    @transition(field=status, source=RUNNABLE, target=S.RUNNING)
    def start(self) -> None:
        """A run starts (or resumes, from its cursor) the step: one more attempt."""

    @transition(field=status, source=S.RUNNING, target=S.SERVING)
    def serve(self) -> None:
        """A service-style step is up and serving until asked to stop."""

    @transition(field=status, source=S.RUNNING, target=S.WAITING)
    def wait(self) -> None:
        """A fan-out step started its child jobs and waits for them."""

    @transition(field=status, source=RUNNABLE, target=S.WAITING)
    def resume_wait(self) -> None:
        """A later run waits again for the children an earlier run started."""

    @transition(field=status, source=STEP_BUSY, target=S.COMPLETED)
    def complete(self) -> None:
        """The step returned (or its children were summed up)."""

    @transition(field=status, source=STEP_BUSY, target=S.FAILED)
    def fail(self) -> None:
        """The step raised; a retry resumes it from its cursor."""

    @transition(field=status, source=(S.PENDING, *STEP_BUSY, S.FAILED), target=S.FAILED)
    def lose(self) -> None:
        """The reaper: its worker was lost on the last attempt; the workflow compensates."""

    @transition(field=status, source=S.COMPLETED, target=S.UNDONE)
    def undo(self) -> None:
        """Compensation ran the step's undo."""

    @transition(field=status, source=(S.FAILED, S.PENDING), target=S.SKIPPED)
    def skip(self) -> None:
        """An operator skips a failed or pending step of a job no worker holds."""
