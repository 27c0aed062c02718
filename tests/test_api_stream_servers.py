"""The progress stream and the long-poll under real servers: uvicorn (ASGI, a
separate process on the test database) and Django's threaded WSGI server (the
one ``runserver`` uses, via pytest-django's ``live_server``).

Progress is reported from the test process with the job's lease token, as a
worker would, while clients read the stream over HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.cache import cache
from rest_framework.authtoken.models import Token

from jobstate import services
from jobstate.models import Job
from tests.e2e.support import database_url, wait_for

ROOT = Path(__file__).resolve().parents[1]
# Poll twice a second: a change reaches the client within ~0.5 s plus a query.
SERVER_JOBSTATE = {"SSE_MAX_SECONDS": 40, "SSE_KEEPALIVE_SECONDS": 5}  # default SSE_POLL_SECONDS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, base: str) -> None:
        self.host, self.port = urlsplit(base).hostname or "127.0.0.1", urlsplit(base).port or 80

    def connect(self, timeout: float = 10) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(
        self, path: str, token: str | None = None, timeout: float = 10, method: str = "GET", **headers: str
    ) -> Any:
        conn = self.connect(timeout)
        if token:
            headers["Authorization"] = f"Token {token}"
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        response.conn = conn  # type: ignore[attr-defined]
        return response


def events(response: Any) -> Iterator[dict[str, Any]]:
    """Parse Server-Sent Events line by line as they arrive."""
    event: dict[str, Any] = {}
    while True:
        line = response.readline()
        if not line:
            return
        text = line.decode().rstrip("\n")
        if not text:
            if event:
                yield event
            event = {}
        elif text.startswith("data: "):
            event["data"] = json.loads(text[6:])
        elif text.startswith("event: "):
            event["event"] = text[7:]
        elif text.startswith(":"):
            event["comment"] = text


def next_job_event(stream: Iterator[dict[str, Any]]) -> dict[str, Any]:
    for event in stream:
        if event.get("event") == "job":
            return event["data"]
        assert event.get("event") != "end", event
    raise AssertionError("the stream ended")


def running_job(user: Any) -> Job:
    services.enqueue("test.echo", {"n": 1}, owner=user)
    (job,) = services.claim("stream-test-worker", ["test.echo"], lease_seconds=120)
    return job


def progress_arrives(server: Server, token: str, job: Job) -> list[float]:
    """Open the stream, then report progress three times; seconds from each
    change to the client receiving it."""
    response = server.get(f"/api/jobs/{job.pk}/events/stream/", token, Accept="text/event-stream")
    assert response.status == 200, response.read()[:500]
    assert response.getheader("Content-Type").startswith("text/event-stream")
    stream = events(response)
    assert next_job_event(stream)["status"] == "processing"
    delays = []
    for percent in (25, 50, 75):
        changed = time.monotonic()
        services.report_progress(job, job.lease_token, percent, f"at {percent}")
        data = next_job_event(stream)
        delays.append(time.monotonic() - changed)
        assert (data["progress"], data["progress_message"]) == (percent, f"at {percent}")
    services.complete(job, job.lease_token, {"ok": True})
    assert next_job_event(stream)["status"] == "completed"
    assert next(stream) == {"event": "end", "data": {"reason": "terminal", "status": "completed"}}
    response.conn.close()
    return delays


@pytest.fixture
def token(user: Any) -> str:
    return str(Token.objects.create(user=user).key)


# Under uvicorn (ASGI) ----------------------------------------------------------------


@pytest.fixture
def uvicorn_server(transactional_db: Any, tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DJANGO_SETTINGS_MODULE="project.test_settings",
        DATABASE_URL=database_url(),
        JOBSTATE_OVERRIDES=json.dumps({**SERVER_JOBSTATE, "API_MAX_STREAMS_PER_USER": 2}),
        JOBSTATE_VAR_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    log = (tmp_path / "uvicorn.log").open("wb")
    command = [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    server = Server(f"http://127.0.0.1:{port}")

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError((tmp_path / "uvicorn.log").read_text())
        try:
            return server.get("/api/", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(up, 30, 0.1, "uvicorn to start")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        print((tmp_path / "uvicorn.log").read_text()[-4000:])


@pytest.mark.e2e
def test_under_uvicorn_progress_reaches_the_client_while_the_job_runs(uvicorn_server, user, token):
    delays = progress_arrives(uvicorn_server, token, running_job(user))
    print(f"uvicorn: change -> event {', '.join(f'{d:.3f}' for d in delays)} s")
    assert max(delays) < 1.0, delays


@pytest.mark.e2e
def test_under_uvicorn_slots_come_back_when_clients_disconnect(uvicorn_server, user, token):
    job = running_job(user)
    path = f"/api/jobs/{job.pk}/events/stream/"
    for _ in range(3):  # three rounds of "open the limit, hang up"
        opened = [uvicorn_server.get(path, token) for _ in range(2)]
        for response in opened:
            assert response.status == 200
            next_job_event(events(response))
        refused = uvicorn_server.get(path, token)
        assert refused.status == 429
        # The first slot ends at the latest after SSE_MAX_SECONDS (+ a poll and 5 s of grace).
        assert 40 <= int(refused.getheader("Retry-After")) <= 46
        refused.conn.close()
        for response in opened:
            response.conn.close()  # the client goes away mid-stream
        started = time.monotonic()
        wait_for(lambda: _status(uvicorn_server, path, token) == 200, 5, 0.1, "a slot after disconnects")
        assert time.monotonic() - started < 3


@pytest.mark.e2e
def test_under_uvicorn_a_head_of_the_stream_holds_none_of_the_users_streams(
    uvicorn_server: Server, user: Any, token: str
) -> None:
    # Each HEAD ran the stream in the server (uvicorn drops the body) for SSE_MAX_SECONDS,
    # one of the user's two streams held while its client waited on the connection.
    path = f"/api/jobs/{running_job(user).pk}/events/stream/"
    heads = [uvicorn_server.get(path, token, method="HEAD") for _ in range(2)]
    assert [(r.status, r.getheader("Content-Type")) for r in heads] == [(200, "text/event-stream")] * 2
    time.sleep(0.5)
    try:
        assert _status(uvicorn_server, path, token) == 200
    finally:
        for response in heads:
            response.conn.close()


def _status(server: Server, path: str, token: str) -> int:
    response = server.get(path, token)
    status = int(response.status)
    response.conn.close()
    return status


@pytest.mark.e2e
def test_under_uvicorn_long_polls_wait_without_blocking_the_server(uvicorn_server, user, token):
    job = running_job(user)
    since = Job.objects.filter(pk=job.pk).values_list("updated_at", flat=True).get()
    since_text = since.isoformat().replace("+00:00", "Z")
    results: list[tuple[int, dict[str, Any], float]] = []

    def poll() -> None:
        started = time.monotonic()
        response = uvicorn_server.get(f"/api/jobs/{job.pk}/?wait=20&since={since_text}", token, timeout=30)
        results.append((response.status, json.loads(response.read()), time.monotonic() - started))

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    listed = uvicorn_server.get("/api/jobs/", token)  # served while both wait
    assert listed.status == 200
    assert not results
    services.report_progress(job, job.lease_token, 60, "halfway")
    for thread in threads:
        thread.join(15)
    assert [(status, body["progress"]) for status, body, _ in results] == [(200, 60), (200, 60)]
    assert all(seconds < 5.0 for _, _, seconds in results), results  # answered on the change, not at 20 s


def server_connections() -> int:
    """The other sessions on this test database: the server's connections."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.e2e
def test_under_uvicorn_waiting_streams_and_long_polls_hold_no_database_connection(
    uvicorn_server, django_user_model
):
    # Each waiting request held one (its thread's) until it ended: a few dozen
    # clients could use up every connection the database allows.
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL's sessions")
    opened, polls = [], []
    for n in range(3):
        owner = django_user_model.objects.create_user(f"watcher{n}", password="x")
        key = str(Token.objects.create(user=owner).key)
        job = running_job(owner)
        stream = uvicorn_server.get(f"/api/jobs/{job.pk}/events/stream/", key, Accept="text/event-stream")
        assert stream.status == 200
        next_job_event(events(stream))
        opened.append(stream)
        since = Job.objects.filter(pk=job.pk).values_list("updated_at", flat=True).get()
        url = f"/api/jobs/{job.pk}/?wait=20&since={since.isoformat().replace('+00:00', 'Z')}"
        polls.append(
            threading.Thread(target=lambda u=url, k=key: uvicorn_server.get(u, k, timeout=30).read())
        )
        polls[-1].start()
    time.sleep(1.5)  # several polls of each: all six wait
    # Held: open in every look. A poll connects, reads and closes, so one look can
    # catch a few polls under way (a loaded machine: three once in CI); the least of
    # several looks counts the connections that stay open.
    looks = []
    for _ in range(5):
        looks.append(server_connections())
        time.sleep(0.1)
    held = min(looks)
    for stream in opened:
        stream.conn.close()
    for job in Job.objects.filter(status="processing"):
        services.report_progress(job, job.lease_token, 50, "done waiting")
    for thread in polls:
        thread.join(15)
    assert held <= 2, f"{held} connections held by 6 waiting requests"


# Under Django's WSGI server (runserver's) ---------------------------------------------


@pytest.fixture
def wsgi_server(live_server: Any, settings: Any) -> Server:
    settings.JOBSTATE = {**SERVER_JOBSTATE}
    cache.clear()
    return Server(live_server.url)


def test_under_the_wsgi_server_progress_reaches_the_client_while_the_job_runs(wsgi_server, user, token):
    delays = progress_arrives(wsgi_server, token, running_job(user))
    print(f"wsgi: change -> event {', '.join(f'{d:.3f}' for d in delays)} s")
    assert max(delays) < 1.0, delays


def test_under_the_wsgi_server_a_long_poll_answers_when_the_job_changes(wsgi_server, user, token):
    job = running_job(user)
    result: list[Any] = []

    def poll() -> None:
        response = wsgi_server.get(f"/api/jobs/{job.pk}/?wait=20", token, timeout=30)
        result.append((response.status, json.loads(response.read())))

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)
    assert not result
    services.report_progress(job, job.lease_token, 30)
    thread.join(10)
    assert [(status, body["progress"]) for status, body in result] == [(200, 30)]
