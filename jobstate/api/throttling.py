"""Throttles for the API.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``, read on every
request (so ``override_settings`` works), under the scopes ``jobstate_enqueue``
(POST /jobs/), ``jobstate`` (every other endpoint) and ``jobstate_stream`` (the
progress stream and long-polls, on top of ``jobstate``). A missing rate means no
limit, except for ``jobstate_stream``, which defaults to ``DEFAULT_RATES``; a
``None`` rate turns a scope off.

A stream or long-poll also holds a server thread while it is open (a WSGI
server has few), so each user may hold at most
``JOBSTATE["API_MAX_STREAMS_PER_USER"]`` (5 by default) at once,
counted in Django's default cache: per process with the local-memory cache,
across processes with a shared one (Redis, Memcached).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.throttling import ScopedRateThrottle

from jobstate import conf

STREAM_SCOPE = "jobstate_stream"
DEFAULT_RATES: dict[str, str] = {STREAM_SCOPE: "120/minute"}
STREAM_RETRY_SECONDS = 5


class JobstateThrottle(ScopedRateThrottle):
    def get_rate(self) -> str | None:
        rates = (getattr(settings, "REST_FRAMEWORK", {}) or {}).get("DEFAULT_THROTTLE_RATES") or {}
        if self.scope in rates:
            return rates[self.scope]
        return DEFAULT_RATES.get(self.scope)

    def allow_request(self, request: Any, view: Any) -> bool:
        self.scope = self.scope_for(view)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super(ScopedRateThrottle, self).allow_request(request, view)

    def scope_for(self, view: Any) -> str | None:
        return getattr(view, self.scope_attr, None)


class StreamThrottle(JobstateThrottle):
    """The ``jobstate_stream`` scope, whatever the view's own scope."""

    def scope_for(self, view: Any) -> str | None:
        return STREAM_SCOPE


def max_streams() -> int | None:
    limit = conf.get("API_MAX_STREAMS_PER_USER")
    return int(limit) if limit else None


class StreamSlot:
    """One of a user's open streams or long-polls; ``release`` is idempotent."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            _decr(self.key)


def _decr(key: str) -> None:
    with suppress(ValueError):  # the counter expired meanwhile
        cache.decr(key)


def hold_stream_slot(user: Any) -> StreamSlot | None:
    """Count one more open stream for ``user``, or raise ``Throttled`` (429)."""
    limit = max_streams()
    if limit is None:
        return None
    key = f"jobstate_streams_{user.pk}"
    # Outlives any slot taken now, so a counter left by a dead process heals.
    ttl = int(float(conf.get("SSE_MAX_SECONDS")) + float(conf.get("LONGPOLL_MAX_SECONDS"))) + 60
    cache.add(key, 0, ttl)
    try:
        count = cache.incr(key)
    except ValueError:  # a cache that keeps nothing (DummyCache): no limit
        return None
    cache.touch(key, ttl)
    if count > limit:
        _decr(key)
        raise Throttled(
            wait=STREAM_RETRY_SECONDS,
            detail=f"At most {limit} progress streams or long-polls may be open at once; close one first.",
        )
    return StreamSlot(key)


@contextmanager
def stream_slot(user: Any) -> Iterator[None]:
    slot = hold_stream_slot(user)
    try:
        yield
    finally:
        if slot is not None:
            slot.release()
