"""Throttles for the API.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``, read on every
request (so ``override_settings`` works), under the scopes ``jobstate_enqueue``
(POST /jobs/), ``jobstate`` (every other endpoint) and ``jobstate_stream`` (the
progress streams and long-polls opened, on top of ``jobstate``; the requests to
those endpoints that open none, a refusal for too many open included, count apart
at the same rate: ``count_stream``, ``open_stream``). A
missing rate means no limit, except for ``jobstate_stream``, which defaults to
``DEFAULT_RATES``; a ``None`` rate turns a scope off.

A stream or long-poll also holds a connection (and under WSGI a server thread)
while it is open, so each user may hold at most
``JOBSTATE["API_MAX_STREAMS_PER_USER"]`` (5 by default) at once, counted in
Django's default cache: per process with the local-memory cache, across
processes with a shared one (Redis, Memcached). A slot is given back when the
response ends or the client goes away, and expires on its own shortly after the
longest the stream could last; a refusal's ``Retry-After`` is when the first
held slot ends at the latest.
"""

from __future__ import annotations

import math
import time
import uuid
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


class JobstateThrottle(ScopedRateThrottle):
    def get_rate(self) -> str | None:
        if self.scope is None:
            return None
        framework = getattr(settings, "REST_FRAMEWORK", {}) or {}
        rates: dict[str, str] = framework.get("DEFAULT_THROTTLE_RATES") or {}
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


class StreamProbeThrottle(StreamThrottle):
    """The ``jobstate_stream`` rate, counted in a history of its own."""

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        key = super().get_cache_key(request, view)
        return None if key is None else f"{key}_probe"


def count_stream(request: Any, view: Any, *, opens: bool) -> None:
    """Count a progress-stream or long-poll request, or raise ``Throttled`` (429).

    One that opens a stream or waits (``opens``) counts against ``jobstate_stream``.
    One that opens nothing (a job the caller cannot see, a 204 for a finished job the
    client has seen, a HEAD) counts against a history of its own at the same rate: such
    probes are bounded, without taking the requests the user's real streams need."""
    throttle = StreamThrottle() if opens else StreamProbeThrottle()
    if not throttle.allow_request(request, view):
        raise Throttled(wait=throttle.wait())


def max_streams() -> int | None:
    limit = conf.get("API_MAX_STREAMS_PER_USER")
    return int(limit) if limit else None


# A slot outlives the longest stream or long-poll by this much, so a slot whose
# server process died (and never released it) comes back on its own.
SLOT_GRACE_SECONDS = 5


def stream_seconds() -> float:
    """How long a progress stream may hold its slot at most."""
    return float(conf.get("SSE_MAX_SECONDS")) + float(conf.get("SSE_POLL_SECONDS"))


def long_poll_seconds(wait: float) -> float:
    return min(float(wait), float(conf.get("LONGPOLL_MAX_SECONDS"))) + float(conf.get("SSE_POLL_SECONDS"))


class StreamSlot:
    """One of a user's open streams or long-polls; ``release`` is idempotent and
    frees only this slot (never one another request took after it expired).
    ``ends_at`` (``time.monotonic``) is when its hold is over; the cache keeps it a
    little longer (``SLOT_GRACE_SECONDS``)."""

    def __init__(self, key: str, token: str, ends_at: float = math.inf) -> None:
        self.key = key
        self.token = token
        self.ends_at = ends_at
        self.held = True

    def expired(self) -> bool:
        return time.monotonic() >= self.ends_at

    def release(self) -> None:
        if self.held:
            self.held = False
            with suppress(Exception):  # a cache outage must not break a finished response
                current = cache.get(self.key)
                if isinstance(current, list | tuple) and current and current[0] == self.token:
                    cache.delete(self.key)


def hold_stream_slot(user: Any, seconds: float | None = None) -> StreamSlot | None:
    """Take one of ``user``'s stream slots for at most ``seconds`` (default: a
    whole progress stream), or raise ``Throttled`` (429) whose ``Retry-After``
    is when the first held slot ends at the latest.

    Each slot is its own cache key (``cache.add`` takes it atomically), holding
    its expiry: counted per process with the local-memory cache, across
    processes with a shared one (Redis, Memcached).
    """
    limit = max_streams()
    if limit is None:
        return None
    hold = stream_seconds() if seconds is None else float(seconds)
    ttl = hold + SLOT_GRACE_SECONDS
    token = uuid.uuid4().hex
    ends_at = time.monotonic() + hold
    keys = [f"jobstate_stream_{user.pk}_{i}" for i in range(limit)]
    for key in keys:
        if cache.add(key, [token, time.time() + ttl], math.ceil(ttl)):
            return StreamSlot(key, token, ends_at)
    held = cache.get_many(keys)
    ends = [v[1] for v in held.values() if isinstance(v, list | tuple) and len(v) == 2]
    # Free by now (expired between add and get_many): try again at once.
    wait = max(1, math.ceil(min(ends) - time.time())) if len(ends) == len(keys) else 1
    raise Throttled(
        wait=wait,
        detail=f"At most {limit} progress streams or long-polls may be open at once; close one first.",
    )


@contextmanager
def stream_slot(user: Any, seconds: float | None = None) -> Iterator[None]:
    slot = hold_stream_slot(user, seconds)
    try:
        yield
    finally:
        if slot is not None:
            slot.release()


def open_stream(request: Any, view: Any, seconds: float | None = None) -> StreamSlot | None:
    """Take one of the user's stream slots (``hold_stream_slot``), and count the
    request against ``jobstate_stream`` as opening a stream; or raise ``Throttled``.

    The slot is taken first: a refusal for too many open streams opens nothing, so it
    counts with the requests that open none (``count_stream(opens=False)``), not
    against the rate the user's real streams need; a client retrying it in a loop
    stays bounded by that count."""
    try:
        slot = hold_stream_slot(request.user, seconds)
    except Throttled:
        count_stream(request, view, opens=False)
        raise
    try:
        count_stream(request, view, opens=True)
    except Throttled:
        if slot is not None:
            slot.release()
        raise
    return slot
