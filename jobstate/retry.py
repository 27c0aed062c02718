"""Retry backoff: exponential with jitter."""

from __future__ import annotations

import logging
import random

from jobstate import conf
from jobstate.registry import HandlerSpec

logger = logging.getLogger("jobstate")

# The longest a retry is put off (a year): a later ``run_after`` is a bug in a
# ``retry_backoff`` callable, and past the year 9999 it cannot be stored at all.
MAX_DELAY_SECONDS = 366 * 24 * 3600.0


def bounded(seconds: float) -> float:
    """A delay within 0 and MAX_DELAY_SECONDS (NaN counts as 0)."""
    if not seconds > 0:
        return 0.0
    return min(seconds, MAX_DELAY_SECONDS)


def backoff_seconds(attempt: int, spec: HandlerSpec | None = None) -> float:
    """Delay before the attempt after ``attempt`` (1-based) that just failed.

    A ``retry_backoff`` callable that raises or returns no number is logged and
    the default backoff applies: the failed attempt must still be recorded."""
    custom = spec.retry_backoff if spec is not None else None
    if callable(custom):
        try:
            return bounded(float(custom(attempt)))
        except Exception:
            logger.exception("retry_backoff of %s failed; the default backoff applies", spec and spec.name)
            custom = None
    base = float(custom) if custom is not None else float(conf.get("RETRY_BACKOFF_BASE"))
    # A float power with a bounded exponent: 2 ** 1024 as an int overflowed the float
    # product (attempt 1025 of a "retry forever" handler), before the cap applied.
    delay: float = min(base * 2.0 ** min(max(attempt - 1, 0), 64), float(conf.get("RETRY_BACKOFF_MAX")))
    return delay + random.uniform(0, delay * float(conf.get("RETRY_JITTER")))
