"""Waiting for a job to change without tight client polling.

- ``event_stream`` / ``aevent_stream``: Server-Sent Events. The server polls one
  small row every ``SSE_POLL_SECONDS`` and sends a ``job`` event whenever the
  snapshot changes, an ``end`` event when the job is terminal or
  ``SSE_MAX_SECONDS`` have passed, and a comment line as keep-alive. Each
  event's ``id`` is the job's ``updated_at`` and a digest of the whole snapshot
  (``event_id``): two changes with the same ``updated_at`` (a coarse clock,
  services given the same ``now``) are two events, and a reconnecting
  EventSource (``Last-Event-ID``) gets no duplicate and misses no change. A
  reconnect that already has a finished job's final event gets ``204 No
  Content`` (``finished_and_seen``): by the SSE specification the client stops
  reconnecting.
- Access is checked again while the stream runs, at most every
  ``ACCESS_CHECK_SECONDS`` (``jobstate.api.access``): once the credentials no longer
  authenticate the same active user, or the job is no longer theirs to see, the
  stream sends one ``error`` event (the 401/404 body a new request would get) and ends.
  A poll that fails (a database error) is logged and ends the stream with an ``error``
  event too (the 500 body, nothing of the error); one the database was too busy for
  (``is_busy``: "database is locked", a lock timeout) sends the 503 ``database_busy``
  body the other endpoints answer, with an SSE ``retry`` of their ``Retry-After``; one
  whose connection failed (``is_unavailable``: PostgreSQL down or restarting) the 503
  ``database_unavailable`` body, the same way.
- The long-poll behind ``GET /jobs/{id}/?wait=&since=`` is ``jobstate.api.longpoll``.

Each comes twice: a plain generator/function for WSGI (the server thread is the
stream's anyway) and an async one for ASGI, where waiting holds no database
connection (each poll connects again) and every chunk is sent as it is made
(Django buffers a sync iterator whole under ASGI). ``streaming_response`` picks
by the request. All are bounded in time;
none holds a transaction open: each poll is one autocommit query, and the views
run outside ``ATOMIC_REQUESTS`` (see ``long_poll_view``).

Each counts against the caller's stream limit (``jobstate.api.throttling``);
``HeldStream`` / ``AsyncHeldStream`` give the slot back when the response ends,
the client goes away or the server closes the response.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.http import StreamingHttpResponse

from jobstate import conf
from jobstate.api.errors import (
    BUSY_MESSAGE,
    BUSY_RETRY_AFTER,
    UNAVAILABLE_MESSAGE,
    UNAVAILABLE_RETRY_AFTER,
    error_body,
    is_busy,
    is_unavailable,
    one_line,
)
from jobstate.api.outputs import JobSnapshotSerializer
from jobstate.api.throttling import StreamSlot
from jobstate.models import Job
from jobstate.states import TERMINAL

logger = logging.getLogger("jobstate.api")

# How often an open stream checks again that its client may see the job: at most once
# per this many seconds (two or three small indexed queries), whatever SSE_POLL_SECONDS.
ACCESS_CHECK_SECONDS = 5.0

# Checks that the stream's client may still see the job: None if so, else the error
# body to send (``jobstate.api.access.StreamAccess.refusal``).
AccessCheck = Callable[[], "dict[str, Any] | None"]

SNAPSHOT_FIELDS = (
    "id",
    "status",
    "progress",
    "progress_message",
    "current_step",
    "cancel_requested_at",
    "error_message",
    "updated_at",
    "finished_at",
)


def snapshot(job_id: Any) -> dict[str, Any] | None:
    row = Job.objects.filter(pk=job_id).values(*SNAPSHOT_FIELDS).first()
    if row is None:
        return None
    row["cancel_requested"] = row.pop("cancel_requested_at") is not None
    # The same representation as the REST detail (DRF's date-time format).
    return dict(JobSnapshotSerializer(row).data)


def _data(data: dict[str, Any]) -> str:
    return json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"))


def event_id(current: dict[str, Any]) -> str:
    """The id of the ``job`` event that sends ``current``: its ``updated_at`` and a
    digest of what the event sends. ``updated_at`` alone missed a change made at the
    same time as the one before it (a coarse clock, services given the same ``now``)."""
    digest = hashlib.blake2b(_data(current).encode(), digest_size=8).hexdigest()
    return f"{current['updated_at']}/{digest}"


def finished_and_seen(job_id: Any, last_event_id: str | None) -> bool:
    """Whether the job is terminal and ``last_event_id`` is its final event's id: all a
    reconnecting client would get is ``end``, and, closing, it would reconnect again
    (an EventSource whose page does not ``close()`` on ``end``), every few seconds forever."""
    if not last_event_id:
        return False
    current = snapshot(job_id)
    return current is not None and current["status"] in TERMINAL and event_id(current) == last_event_id


def _event(name: str, data: dict[str, Any], ident: str | None = None) -> bytes:
    lines = [f"event: {name}"]
    if ident:
        lines.append(f"id: {ident}")
    lines.append(f"data: {_data(data)}")
    return ("\n".join(lines) + "\n\n").encode()


class _Events:
    """What the stream sends, whoever drives it (sync or async)."""

    def __init__(self, last_event_id: str | None, clock: Callable[[], float]) -> None:
        self.max_seconds = float(conf.get("SSE_MAX_SECONDS"))
        self.poll = max(float(conf.get("SSE_POLL_SECONDS")), 0.01)
        self.keepalive = float(conf.get("SSE_KEEPALIVE_SECONDS"))
        self.clock = clock
        self.started = self.last_beat = clock()
        self.sent: str | None = last_event_id
        self.done = False
        self.access_checked = self.started  # the view checked it as the stream opened

    def access_due(self) -> bool:
        now = self.clock()
        if now - self.access_checked < ACCESS_CHECK_SECONDS:
            return False
        self.access_checked = now
        return True

    def opening(self) -> bytes:
        return f"retry: {int(self.poll * 1000) + 1000}\n\n".encode()

    def after(self, current: dict[str, Any] | None, refused: dict[str, Any] | None = None) -> list[bytes]:
        """The chunks to send after one poll (each whole events); sets ``done``."""
        if refused is not None:
            self.done = True
            return [_event("error", refused)]  # access lost: nothing about the job
        if current is None:
            self.done = True
            return [_event("end", {"reason": "deleted"})]
        chunks = []
        ident = event_id(current)  # the whole snapshot's: any change is sent, whatever its time
        if ident != self.sent:
            self.sent = ident
            self.last_beat = self.clock()
            chunks.append(_event("job", current, ident))
        if current["status"] in TERMINAL:
            self.done = True
            return [*chunks, _event("end", {"reason": "terminal", "status": current["status"]})]
        now = self.clock()
        if now - self.started >= self.max_seconds:
            self.done = True
            return [*chunks, _event("end", {"reason": "timeout"})]
        if now - self.last_beat >= self.keepalive:
            self.last_beat = now
            chunks.append(b": keep-alive\n\n")
        return chunks

    def pause(self) -> float:
        return min(self.poll, max(self.max_seconds - (self.clock() - self.started), 0))


def _read(job_id: Any, access: AccessCheck | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """One poll: the refusal, if ``access`` is given and says no (then no snapshot is
    read), and the job's snapshot."""
    refused = access() if access is not None else None
    return refused, None if refused is not None else snapshot(job_id)


# What a stream sends last when a poll fails (a database error): the body of a 500,
# nothing of the error itself. The stream used to just end, which looks like a normal close.
FAILED = _event("error", error_body("server_error", "Internal server error."))
# A poll the database was too busy for: what the other endpoints answer (a 503 to retry),
# its Retry-After as the reconnection time an EventSource waits (SSE's ``retry``).
BUSY = f"retry: {BUSY_RETRY_AFTER * 1000}\n".encode() + _event(
    "error", error_body("database_busy", BUSY_MESSAGE)
)
# A poll whose database connection failed (``is_unavailable``): the same, with its 503.
UNAVAILABLE = f"retry: {UNAVAILABLE_RETRY_AFTER * 1000}\n".encode() + _event(
    "error", error_body("database_unavailable", UNAVAILABLE_MESSAGE)
)


def _failed(job_id: Any, exc: Exception) -> bytes:
    if is_busy(exc):
        logger.warning("Progress stream of job %s stopped: database busy: %s", job_id, exc)
        return BUSY
    if is_unavailable(exc):
        logger.warning("Progress stream of job %s stopped: database unavailable: %s", job_id, one_line(exc))
        return UNAVAILABLE
    logger.exception("Progress stream of job %s stopped on an error", job_id)
    return FAILED


def event_stream(
    job_id: Any,
    *,
    last_event_id: str | None = None,
    access: AccessCheck | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    events = _Events(last_event_id, clock)
    yield events.opening()
    while True:
        try:
            refused, current = _read(job_id, access if access is not None and events.access_due() else None)
            chunks = events.after(current, refused)
        except Exception as exc:
            yield _failed(job_id, exc)
            return
        yield from chunks
        if events.done:
            return
        sleep(events.pause())


def polled(read: Callable[..., Any]) -> Callable[..., Any]:
    """``read`` for the async waits, closing the request's database connections after
    each call. Under ASGI a request's synchronous calls run in a thread of its own, and
    a connection opened there stayed open for the whole stream or long-poll (up to
    SSE_MAX_SECONDS): a few dozen waiting clients held as many connections, enough to
    use up what the database allows and stop the workers. Each poll connects again
    (cheap with a connection pool: ``DATABASES[...]["OPTIONS"]["pool"]``)."""

    @wraps(read)
    def call(*args: Any) -> Any:
        try:
            return read(*args)
        finally:
            for conn in connections.all(initialized_only=True):
                if not conn.in_atomic_block:
                    conn.close()

    return call


async def aevent_stream(
    job_id: Any,
    *,
    last_event_id: str | None = None,
    access: AccessCheck | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[bytes]:
    events = _Events(last_event_id, clock)
    read = sync_to_async(polled(_read))  # the check and the poll: one connection
    yield events.opening()
    while True:
        try:
            refused, current = await read(
                job_id, access if access is not None and events.access_due() else None
            )
            chunks = events.after(current, refused)
        except Exception as exc:  # not a cancellation (the client went away): a BaseException
            yield _failed(job_id, exc)
            return
        for chunk in chunks:
            yield chunk
        if events.done:
            return
        await sleep(events.pause())


class HeldStream:
    """An event stream that releases its slot when the server closes the response
    (a WSGI server always does, and Django registers ``close``), or at the
    latest when the response is garbage-collected unread."""

    def __init__(self, events: Iterator[bytes], slot: StreamSlot | None) -> None:
        self.events = events
        self.slot = slot
        if slot is not None:
            weakref.finalize(self, slot.release)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.events:
            yield chunk
            if self.slot is not None and self.slot.expired():
                # Read so slowly that the slot's time ran out while the server wrote
                # this chunk: stop here, with no further poll or write (the next write
                # could block as long again, past the slot's expiry, with the user's
                # next stream already let in). The client reconnects.
                return

    def close(self) -> None:
        close = getattr(self.events, "close", None)
        if close is not None:
            close()
        if self.slot is not None:
            self.slot.release()


class AsyncHeldStream:
    """The ASGI twin of ``HeldStream``: the slot comes back when the stream ends,
    when the client disconnects (Django cancels the response, the generator's
    ``finally`` runs) and when Django closes the response."""

    def __init__(self, events: AsyncIterator[bytes], slot: StreamSlot | None) -> None:
        self.events = events
        self.slot = slot
        if slot is not None:
            weakref.finalize(self, slot.release)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.events:
                yield chunk
                if self.slot is not None and self.slot.expired():
                    return  # as HeldStream: no poll or write past the slot's time
        finally:
            self.close()

    def close(self) -> None:
        if self.slot is not None:
            self.slot.release()


def is_asgi(request: Any) -> bool:
    return isinstance(getattr(request, "_request", request), ASGIRequest)


async def _no_events() -> AsyncIterator[bytes]:
    """A HEAD's (async) body: nothing."""
    nothing: tuple[bytes, ...] = ()
    for chunk in nothing:
        yield chunk


def streaming_response(
    request: Any,
    job_id: Any,
    last_event_id: str | None,
    slot: StreamSlot | None,
    access: AccessCheck | None = None,
) -> StreamingHttpResponse:
    """The progress stream as the server wants it: async under ASGI, sync under WSGI.
    A HEAD gets the headers only: a server reads a HEAD's body to the end too (and
    drops it), which held the request polling for up to SSE_MAX_SECONDS."""
    head = request.method == "HEAD"
    # A project's GZipMiddleware compresses a streaming response, except for a request
    # that accepts no gzip (its documented rule, read after the view): compressed, each
    # event waited in zlib's buffer until a block filled, often until the stream ended.
    request.META.pop("HTTP_ACCEPT_ENCODING", None)
    if is_asgi(request):
        events: Any = (
            _no_events() if head else aevent_stream(job_id, last_event_id=last_event_id, access=access)
        )
        content: Any = AsyncHeldStream(events, slot)
    else:
        stream = iter(()) if head else event_stream(job_id, last_event_id=last_event_id, access=access)
        content = HeldStream(stream, slot)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response
