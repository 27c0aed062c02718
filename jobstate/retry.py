"""Retry backoff: exponential with jitter."""

from __future__ import annotations

import random

from jobstate import conf
from jobstate.registry import HandlerSpec


def backoff_seconds(attempt: int, spec: HandlerSpec | None = None) -> float:
    """Delay before the attempt after ``attempt`` (1-based) that just failed."""
    custom = spec.retry_backoff if spec is not None else None
    if callable(custom):
        return max(0.0, float(custom(attempt)))
    base = float(custom) if custom is not None else float(conf.get("RETRY_BACKOFF_BASE"))
    delay: float = min(base * 2 ** max(attempt - 1, 0), float(conf.get("RETRY_BACKOFF_MAX")))
    return delay + random.uniform(0, delay * float(conf.get("RETRY_JITTER")))
