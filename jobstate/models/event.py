"""The append-only transition history."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobstate.states import Status


class JobEvent(models.Model):
    """One committed state change of a job: who, from, to, why, when.

    Rows are written by jobstate.services in the same transaction as the change
    they record, and never updated.
    """

    # Indexed by jobstate_event_job_idx (job, id), which serves every lookup by job.
    job = models.ForeignKey("jobstate.Job", on_delete=models.CASCADE, related_name="events", db_index=False)
    from_status = models.CharField(max_length=20, choices=Status.choices, blank=True, default="")
    to_status = models.CharField(max_length=20, choices=Status.choices)
    transition = models.CharField(max_length=50)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        # Workers and the system act without a user: jobstate_event_actor_idx
        # holds only the rows that name one.
        db_index=False,
    )
    actor_label = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # Insertion order, not clock order: a job's events are written under its
        # row lock, so ids follow the real sequence even when clocks disagree.
        ordering = ("id",)
        indexes = [
            models.Index(fields=["job", "id"], name="jobstate_event_job_idx"),
            models.Index(
                fields=["actor"], condition=models.Q(actor__isnull=False), name="jobstate_event_actor_idx"
            ),
        ]
        constraints = [
            # Both ends are statuses ("" starts an enqueue). They may be equal: a
            # cancel or stop request, a step's change.
            models.CheckConstraint(
                condition=models.Q(from_status__in=["", *Status.values])
                & models.Q(to_status__in=Status.values),
                name="jobstate_event_statuses_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.from_status or '∅'} → {self.to_status} ({self.transition})"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None and not self._state.adding:
            raise ValueError("JobEvent rows are append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @property
    def actor_user(self) -> str | None:
        """The username of the user who acted, if one did (and still exists)."""
        return self.actor.get_username() if self.actor_id is not None and self.actor else None

    @property
    def actor_text(self) -> str:
        """Who made the change, as the admin and ``manage.py jobstate show`` print it:
        its label, with the user's name when a user acted (``api (alice)``)."""
        user = self.actor_user
        return f"{self.actor_label} ({user})" if user is not None else self.actor_label or "-"
