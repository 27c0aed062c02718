"""Rotating an endpoint's signing secret: one rule for the REST API and the admin.

A secret is shown once, in the answer to the request that made it (the endpoint's
creation or a rotation), and never again: whoever lost it rotates it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from jobstate.webhooks.models import WebhookEndpoint, new_secret


class RotationRefused(Exception):
    """The previous secret's overlap still runs (rotate with overlap 0 to end it)."""

    def __init__(self, signing_until: datetime) -> None:
        self.signing_until = signing_until
        super().__init__(self.message(signing_until.isoformat()))

    @staticmethod
    def message(signing_until: str) -> str:
        """The refusal, with ``signing_until`` written as the caller writes a time."""
        return (
            f"The previous secret signs until {signing_until} (the last rotation's overlap): rotate "
            "again after that, or with overlap_seconds 0 to stop every older secret signing now."
        )


def rotate(endpoint_pk: int, overlap_seconds: int) -> WebhookEndpoint:
    """A new secret for the endpoint; the old one keeps signing for ``overlap_seconds``.

    Read under the row lock its write keeps: two rotations at once both passed the
    overlap check, and the second's save dropped the secret the first had returned.
    Raises ``WebhookEndpoint.DoesNotExist`` or ``RotationRefused`` (nothing written)."""
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint_pk)
        signing_until = endpoint.previous_secret_expires_at
        if (
            overlap_seconds > 0
            and endpoint.previous_secret
            and signing_until
            and signing_until > timezone.now()
        ):
            # One previous secret is kept: rotating again would stop the one whose
            # overlap receivers were promised at once.
            raise RotationRefused(signing_until)
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_expires_at = timezone.now() + timedelta(seconds=overlap_seconds)
        endpoint.secret = new_secret()
        endpoint.save()
    return endpoint
