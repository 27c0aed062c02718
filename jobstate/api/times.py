"""Times from the API's input, put in the terms the database compares them in, and
the one way the API writes a time (``as_written``)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone


def as_stored(value: datetime) -> datetime:
    """``value`` as stored times compare with it: in UTC with ``USE_TZ`` (PostgreSQL
    refuses an offset past ±15:59), else naive in ``TIME_ZONE``, as Django stores
    them then (SQLite refuses an aware one; naive in UTC is hours off). A naive
    ``value`` is taken to be in those terms already. Raises ``OverflowError`` at
    the calendar's edges."""
    if settings.USE_TZ:
        return value.astimezone(UTC)
    if timezone.is_naive(value):
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def as_written(value: datetime) -> str:
    """``value`` as the API writes every time: ISO 8601 in UTC ("…Z"), whatever the
    active time zone. A naive ``value`` is in ``TIME_ZONE`` (``USE_TZ = False``: as
    Django stores it then)."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_default_timezone())
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
