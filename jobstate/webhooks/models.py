"""Webhook subscriptions and the record of each delivery attempt."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from django.conf import settings
from django.db import models, router
from django.db.models import Q
from django.utils import timezone

from jobstate.webhooks import cache

SECRET_PREFIX = "whsec_"

# What an endpoint can subscribe to: the job's transition that produces each event.
EVENTS: dict[str, str] = {
    "job.completed": "The job completed.",
    "job.failed": "The job failed (attempts exhausted, non-retryable error, worker lost, operator).",
    "job.cancelled": "The job was cancelled.",
    "job.partial": "The job finished with a result and an error.",
    "job.started": "A worker claimed the job (each attempt).",
    "job.step": "A workflow step ended (completed or failed); the job's steps show which.",
    "job.requeued": (
        "The job went back to the queue (a retry, a rescue by the reaper, a workflow woken once "
        "its children ended)."
    ),
}
TERMINAL_EVENTS = ["job.completed", "job.failed", "job.cancelled", "job.partial"]


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 24 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def default_events() -> list[str]:
    return list(TERMINAL_EVENTS)


class WebhookEndpoint(models.Model):
    """Where to tell someone that their jobs changed.

    An owner's endpoint hears about that owner's jobs; a global one (no owner,
    staff only) about every job, while the staff user ``answerable`` for it may
    view every job (``jobstate.webhooks.answerable``).
    """

    # Written by jobstate, never by the endpoint's owner (read-only in the API and admin).
    SERVER_FIELDS = (
        "secret",
        "previous_secret_expires_at",
        "consecutive_failures",
        "disabled_at",
        "disabled_reason",
        "created_at",
        "updated_at",
    )

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="jobstate_webhooks",
        help_text="Empty: a global endpoint that hears about every job (staff only).",
    )
    answerable = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        editable=False,
        related_name="jobstate_answerable_webhooks",
        help_text="Global endpoints only: the staff user who made it or last changed it. It is "
        "disabled at its next delivery once they may not view every job.",
    )
    url = models.URLField(max_length=1000)
    description = models.CharField(max_length=200, blank=True, default="")
    events = models.JSONField(default=default_events, help_text="Event types wanted.")
    kinds = models.JSONField(default=list, blank=True, help_text="Only these job kinds (empty: all).")
    secret = models.CharField(max_length=100, default=new_secret, editable=False)
    previous_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)
    disabled_at = models.DateTimeField(null=True, blank=True, editable=False)
    disabled_reason = models.TextField(
        blank=True, default="", editable=False, help_text="Why deliveries stopped (empty while enabled)."
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "jobstate"
        ordering = ("-created_at", "-id")
        indexes = [models.Index(fields=["enabled", "owner"], name="jobstate_webhook_enabled_idx")]
        constraints = [
            # An owner's endpoint is answered for by its owner.
            models.CheckConstraint(
                condition=Q(owner__isnull=True) | Q(answerable__isnull=True),
                name="jobstate_webhook_answerable_global",
            ),
        ]
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        cache.changed(self._state.db)

    def delete(self, using: Any = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        using = using or router.db_for_write(type(self), instance=self)
        result = super().delete(using=using, keep_parents=keep_parents)
        cache.changed(using)
        return result

    def signing_secrets(self, now: Any = None) -> list[str]:
        """The secrets that sign a delivery now: the current one, and the previous
        one while its overlap lasts."""
        now = now or timezone.now()
        found = [self.secret]
        if self.previous_secret and self.previous_secret_expires_at and self.previous_secret_expires_at > now:
            found.append(self.previous_secret)
        return found


class WebhookDelivery(models.Model):
    """One attempt to deliver one event to one endpoint (kept for the owner to see)."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    webhook_id = models.CharField(
        max_length=64, help_text="The webhook-id header: the same on every attempt."
    )
    event = models.CharField(max_length=50)
    job_id = models.UUIDField(help_text="The job the event is about.")
    delivery_job_id = models.UUIDField(null=True, blank=True, help_text="The jobstate.webhook job.")
    attempt = models.PositiveIntegerField(default=1)
    ok = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    response_body = models.TextField(blank=True, default="", help_text="The first KiB of the response.")
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "jobstate"
        ordering = ("-id",)
        indexes = [
            models.Index(fields=["endpoint", "-id"], name="jobstate_delivery_ep_idx"),
            models.Index(fields=["webhook_id"], name="jobstate_delivery_msg_idx"),
            # The admin's search by a job's id (a delivery row is written once: one entry).
            models.Index(fields=["job_id"], name="jobstate_delivery_job_idx"),
        ]
        constraints = [
            # Delivered means the receiver answered 2xx (``delivery.deliver``).
            models.CheckConstraint(
                condition=Q(ok=False)
                | Q(status_code__isnull=False, status_code__gte=200, status_code__lte=299),
                name="jobstate_delivery_ok_is_2xx",
            ),
        ]
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event} {self.webhook_id} #{self.attempt}"
