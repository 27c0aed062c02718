"""Waiting for a job to change without tight client polling.

- ``event_stream``: Server-Sent Events. The server polls one small row every
  ``SSE_POLL_SECONDS`` and sends a ``job`` event whenever the snapshot changes,
  an ``end`` event when the job is terminal or ``SSE_MAX_SECONDS`` have passed,
  and a comment line as keep-alive. Each event's ``id`` is the job's
  ``updated_at``, so a reconnecting EventSource (``Last-Event-ID``) gets no
  duplicate.
- ``wait_for_change``: the long-poll behind ``GET /jobs/{id}/?wait=&since=``.

Both are bounded in time; neither holds a transaction open between polls.
Each holds a server thread, so each counts against the caller's stream limit
(``jobstate.api.throttling``); ``HeldStream`` gives the slot back when the
server closes the response.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from jobstate import conf
from jobstate.api.serializers import JobSnapshotSerializer
from jobstate.api.throttling import StreamSlot
from jobstate.models import Job
from jobstate.states import TERMINAL

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


def _event(name: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    lines = [f"event: {name}"]
    if event_id:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data, cls=DjangoJSONEncoder, separators=(',', ':'))}")
    return ("\n".join(lines) + "\n\n").encode()


def event_stream(
    job_id: Any,
    *,
    last_event_id: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    max_seconds = float(conf.get("SSE_MAX_SECONDS"))
    poll = max(float(conf.get("SSE_POLL_SECONDS")), 0.01)
    keepalive = float(conf.get("SSE_KEEPALIVE_SECONDS"))
    started = last_beat = clock()
    sent: str | None = last_event_id
    yield f"retry: {int(poll * 1000) + 1000}\n\n".encode()
    while True:
        current = snapshot(job_id)
        if current is None:
            yield _event("end", {"reason": "deleted"})
            return
        stamp = current["updated_at"]
        if stamp != sent:
            sent = stamp
            last_beat = clock()
            yield _event("job", current, stamp)
        if current["status"] in TERMINAL:
            yield _event("end", {"reason": "terminal", "status": current["status"]})
            return
        now = clock()
        if now - started >= max_seconds:
            yield _event("end", {"reason": "timeout"})
            return
        if now - last_beat >= keepalive:
            last_beat = now
            yield b": keep-alive\n\n"
        sleep(min(poll, max(max_seconds - (now - started), 0)))


def wait_for_change(
    job_id: Any,
    since: datetime,
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the job's ``updated_at`` is later than ``since``, it is
    terminal or gone, or ``seconds`` (capped by LONGPOLL_MAX_SECONDS) passed."""
    seconds = min(seconds, float(conf.get("LONGPOLL_MAX_SECONDS")))
    poll = max(float(conf.get("SSE_POLL_SECONDS")), 0.01)
    deadline = clock() + seconds
    while True:
        row = Job.objects.filter(pk=job_id).values_list("updated_at", "status").first()
        if row is None or row[0] > since or row[1] in TERMINAL:
            return
        remaining = deadline - clock()
        if remaining <= 0:
            return
        sleep(min(poll, remaining))


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
        return self.events

    def close(self) -> None:
        close = getattr(self.events, "close", None)
        if close is not None:
            close()
        if self.slot is not None:
            self.slot.release()
