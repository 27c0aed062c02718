"""A real HTTP receiver on 127.0.0.1 for the webhook tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection

from jobstate.webhooks import outbox


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived (time.monotonic)


@dataclass
class Receiver:
    url: str
    requests: list[Received] = field(default_factory=list)
    # Status codes to answer, in turn; 200 once they run out.
    statuses: list[int] = field(default_factory=list)
    # How many of the first requests to leave unanswered until ``release`` is set.
    holds: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    # Seconds between the bytes of a dripped answer (0: answer at once): every read
    # of the sender gets a byte quickly, the whole answer takes seconds.
    drip: float = 0.0
    # Drip only the body (the status line and headers come at once).
    drip_body_only: bool = False
    # The body of a 2xx answer.
    reply: bytes = b"thanks"


DRIPPED_BODY = b"x" * 200


def drip_answer(wfile: Any, delay: float, body_only: bool) -> None:
    """A 200 with a 200-byte body, written a byte at a time (all of it, or the body)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(DRIPPED_BODY)
    answer = head + DRIPPED_BODY
    start = len(head) if body_only else 0
    try:
        wfile.write(answer[:start])
        for i in range(start, len(answer)):
            wfile.write(answer[i : i + 1])
            wfile.flush()
            time.sleep(delay)
    except OSError:
        pass  # the sender hung up


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if len(state.requests) <= state.holds:
                state.release.wait(60)
            if state.drip:
                self.close_connection = True
                drip_answer(self.wfile, state.drip, state.drip_body_only)
                return
            code = state.statuses.pop(0) if state.statuses else 200
            reply = state.reply if code < 300 else b"nope"
            self.send_response(code)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/jobs"
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def read_in_another_thread() -> frozenset[str]:
    """What another thread of this process caches: the committed endpoints."""
    seen: list[frozenset[str]] = []

    def read() -> None:
        try:
            seen.append(outbox.wanted_events())
        finally:
            connection.close()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(10)
    return seen[0]
