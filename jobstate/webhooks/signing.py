"""Standard Webhooks signatures (https://www.standardwebhooks.com/)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable

from jobstate.webhooks.models import SECRET_PREFIX


def secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """``v1,`` and the base64 HMAC-SHA256 of ``id.timestamp.body``."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets: Iterable[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers; one signature per secret (two during a
    rotation's overlap), separated by spaces."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, webhook_id, timestamp, body) for s in secrets),
    }
