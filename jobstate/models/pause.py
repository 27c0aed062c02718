"""Paused kinds: an operator's hold on claiming a kind's jobs, kept as an audit trail."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class KindPauseQuerySet(models.QuerySet["KindPause"]):
    def active(self) -> KindPauseQuerySet:
        """Pauses not resumed yet (at most one per kind): the kinds paused now."""
        return self.filter(resumed_at__isnull=True)


class KindPause(models.Model):
    """One pause of a job kind, from ``paused_at`` until ``resumed_at`` (None: still
    paused). While a kind has an active pause no worker claims its queued jobs; they
    stay queued, enqueue still accepts new ones, and jobs already running finish.

    Rows are written by ``jobstate.services.pauses`` only and kept after the
    resume as the record of who paused and resumed the kind, when and why, until
    retention deletes it (``RETENTION_DAYS`` after the resume; never an active one). The
    database holds at most one active pause per kind (``jobstate_kindpause_one_active``).
    """

    kind = models.CharField(max_length=200, db_index=True)
    paused_at = models.DateTimeField(default=timezone.now)
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    paused_by_label = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resumed_by_label = models.CharField(max_length=200, blank=True, default="")
    resume_reason = models.TextField(blank=True, default="")

    objects = KindPauseQuerySet.as_manager()

    class Meta:
        ordering = ("-paused_at", "-id")
        verbose_name = "kind pause"
        verbose_name_plural = "kind pauses"
        constraints = [
            # A claim's NOT EXISTS probes this index (kind, active) per candidate kind.
            models.UniqueConstraint(
                fields=["kind"],
                condition=models.Q(resumed_at__isnull=True),
                name="jobstate_kindpause_one_active",
            ),
        ]

    def __str__(self) -> str:
        state = "paused" if self.resumed_at is None else "resumed"
        return f"{self.kind} ({state})"

    @property
    def active(self) -> bool:
        return self.resumed_at is None

    @staticmethod
    def _who(label: str, user: object) -> str:
        name = user.get_username() if user is not None else None  # type: ignore[attr-defined]
        return f"{label} ({name})" if name else label or "-"

    @property
    def paused_by_text(self) -> str:
        """Who paused it, as ``JobEvent.actor_text`` prints an actor: ``admin (alice)``."""
        return self._who(self.paused_by_label, self.paused_by if self.paused_by_id else None)

    @property
    def resumed_by_text(self) -> str:
        return self._who(self.resumed_by_label, self.resumed_by if self.resumed_by_id else None)
