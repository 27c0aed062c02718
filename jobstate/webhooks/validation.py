"""What an endpoint's ``url``, ``events`` and ``kinds`` may be: one definition,
used by the REST API's serializer and the admin's form. Each function returns
the cleaned value or raises Django's ``ValidationError`` (which DRF reports as a
400 on the field, and a form shows next to it).

``kinds_or_none`` and ``events_or_none`` read stored rows for the outbox, which
must never fail a job's transition over an endpoint saved some other way."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from jobstate import conf
from jobstate.storable import text
from jobstate.webhooks import transport
from jobstate.webhooks.models import EVENTS

KIND_MAX_LENGTH = 200  # Job.kind's
# Kinds an endpoint names at most, repeats removed: the outbox reads them on every
# transition of its owner's jobs.
MAX_KINDS = 100


def url(value: str) -> str:
    """An http(s) URL with a valid port, not a literal non-public address (unless
    WEBHOOK_ALLOW_PRIVATE); names are checked after resolution, at each delivery."""
    try:
        transport.check_url(value)
    except transport.Blocked as exc:
        raise ValidationError(str(exc), code="invalid") from None
    parts = urlsplit(value)
    if parts.username is not None or parts.password is not None:
        # They would never be sent (deliveries carry no Authorization header), and the
        # URL is shown in the API and the admin: the receiver checks the signature instead.
        raise ValidationError(
            "A URL with a user name or password (user:pass@) is not allowed: they would not be "
            "sent. The receiver verifies each delivery's signature (webhook-signature) instead.",
            code="credentials",
        )
    host = parts.hostname or ""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return value
    if not conf.get("WEBHOOK_ALLOW_PRIVATE") and transport.forbidden(str(literal)):
        raise ValidationError("Deliveries to non-public addresses are not allowed here.", code="private")
    return value


def events(value: Any) -> list[str]:
    """A non-empty list of known event types."""
    if not isinstance(value, list) or not value:
        raise ValidationError(
            "A non-empty list of event types, from: %(known)s.",
            code="invalid",
            params={"known": ", ".join(sorted(EVENTS))},
        )
    unknown = [item for item in value if not (isinstance(item, str) and item in EVENTS)]
    if unknown:
        raise ValidationError(
            "Not an event type: %(item)s (known: %(known)s).",
            code="invalid_choice",
            params={"item": repr(unknown[0])[:100], "known": ", ".join(sorted(EVENTS))},
        )
    return list(dict.fromkeys(value))  # repeats removed, in order


def kinds(value: Any) -> list[str]:
    """A list of at most ``MAX_KINDS`` job kinds (empty or none: every kind):
    non-blank strings of at most 200 characters without NUL or lone surrogates,
    repeats removed (in order). Kinds are matched exactly as sent, as an enqueue's
    kind is looked up: one with surrounding whitespace is refused (most likely a
    typo for the kind without it), not stripped into another kind."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError("A list of job kinds (empty: every kind).", code="invalid")
    cleaned: dict[str, None] = {}
    for item in value:
        if isinstance(item, str) and item.strip() and item != item.strip():
            raise ValidationError(
                "Not a job kind: %(item)s (surrounding whitespace: kinds are matched exactly as sent).",
                code="whitespace",
                params={"item": repr(item)[:100]},
            )
        kind = item if isinstance(item, str) else None
        # text() changes a NUL or a lone surrogate (which the admin's JSON field lets
        # through, and a jsonb column refuses: a 500).
        if not kind or not kind.strip() or len(kind) > KIND_MAX_LENGTH or text(kind) != kind:
            raise ValidationError(
                "Not a job kind: %(item)s (a non-blank name of at most %(max)s characters, "
                "no NUL or lone surrogate).",
                code="invalid",
                params={"item": repr(item)[:100], "max": KIND_MAX_LENGTH},
            )
        cleaned[kind] = None
        if len(cleaned) > MAX_KINDS:
            raise ValidationError(
                "At most %(max)s job kinds (repeats count once); leave the list empty for every kind.",
                code="max_length",
                params={"max": MAX_KINDS},
            )
    return list(cleaned)


def events_or_none(value: Any) -> frozenset[str] | None:
    """A stored row's events, or None when they are not a list of strings."""
    return _strings(value)


def kinds_or_none(value: Any) -> frozenset[str] | None:
    """A stored row's kinds (empty: every kind), or None when they are not a list
    of strings (a string would otherwise match its substrings)."""
    return frozenset() if value is None else _strings(value)


def _strings(value: Any) -> frozenset[str] | None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return frozenset(value)
