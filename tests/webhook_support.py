"""A real HTTP receiver on 127.0.0.1 for the webhook tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    requests: list[Received] = field(default_factory=list)
    # Status codes to answer, in turn; 200 once they run out.
    statuses: list[int] = field(default_factory=list)
    # How many of the first requests to leave unanswered until ``release`` is set.
    holds: int = 0
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if len(state.requests) <= state.holds:
                state.release.wait(60)
            code = state.statuses.pop(0) if state.statuses else 200
            reply = b"thanks" if code < 300 else b"nope"
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
