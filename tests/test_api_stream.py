"""REST API: the Server-Sent Events progress stream (bounded; never hangs)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import RequestFactory, override_settings
from rest_framework.authtoken.models import Token

from jobstate import services
from jobstate.models import Job
from tests.api_support import client_for, completed, grant, job_url, make_job, running

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

FAST = {"SSE_POLL_SECONDS": 0.02, "SSE_MAX_SECONDS": 5, "SSE_KEEPALIVE_SECONDS": 60}


def events(chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """Parse an event stream chunk by chunk (each chunk is whole events)."""
    for chunk in chunks:
        for block in chunk.decode().split("\n\n"):
            if not block.strip():
                continue
            event: dict[str, Any] = {}
            for line in block.split("\n"):
                field, _, value = line.partition(": ")
                if field == "data":
                    event["data"] = json.loads(value)
                elif field in ("event", "id", "retry"):
                    event[field] = value
                elif line.startswith(":"):
                    event["comment"] = line
                elif line.startswith("retry:"):
                    event["retry"] = line.split(":", 1)[1].strip()
            yield event


def open_stream(user: Any, job: Any, **headers: str) -> Any:
    response = client_for(user).get(
        job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream", **headers
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    return response


@override_settings(JOBSTATE=FAST)
def test_a_finished_job_sends_its_snapshot_and_ends(user):
    job = completed(user)
    got = list(events(open_stream(user, job).streaming_content))
    assert "retry" in got[0]
    assert got[1]["event"] == "job" and got[1]["data"]["status"] == "completed"
    assert got[1]["data"]["progress"] == 100
    stamp, _, digest = got[1]["id"].rpartition("/")  # updated_at, and a digest of the snapshot
    assert stamp == got[1]["data"]["updated_at"] and re.fullmatch("[0-9a-f]{16}", digest)
    assert got[2] == {"event": "end", "data": {"reason": "terminal", "status": "completed"}}
    assert len(got) == 3


@override_settings(JOBSTATE=FAST)
def test_changes_are_sent_as_they_happen_until_the_job_ends(user):
    job = running(user)
    stream = events(open_stream(user, job).streaming_content)
    assert "retry" in next(stream)
    first = next(stream)
    assert (first["event"], first["data"]["status"], first["data"]["progress"]) == ("job", "processing", 0)

    services.report_progress(job, job.lease_token, 40, "resizing", step="resize")
    update = next(stream)
    assert update["data"]["progress"] == 40
    assert (update["data"]["progress_message"], update["data"]["current_step"]) == ("resizing", "resize")

    services.request_cancel(job, services.Actor.api(user))
    assert next(stream)["data"]["cancel_requested"] is True

    services.cancel_now(job, job.lease_token)
    assert next(stream)["data"]["status"] == "cancelled"
    assert next(stream) == {"event": "end", "data": {"reason": "terminal", "status": "cancelled"}}
    assert list(stream) == []


# A second of stream for keep-alives every 0.1 s: with 0.3 s, one stalled poll on a loaded
# machine (seen in CI) reached the end before the first keep-alive was due.
@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 1.0, "SSE_KEEPALIVE_SECONDS": 0.1})
def test_the_stream_ends_after_the_maximum_duration_with_keep_alives(user):
    job = make_job(user)
    started = time.monotonic()
    got = list(events(open_stream(user, job).streaming_content))
    elapsed = time.monotonic() - started
    assert got[-1] == {"event": "end", "data": {"reason": "timeout"}}
    assert [e["event"] for e in got if e.get("event") == "job"] == ["job"]  # nothing changed
    assert any("comment" in e for e in got)
    assert 0.95 <= elapsed < 5


@override_settings(JOBSTATE=FAST)
def test_a_reconnect_with_last_event_id_skips_what_the_client_has(user):
    job = running(user)
    seen = list(islice(events(open_stream(user, job).streaming_content), 2))[1]["id"]
    stream = events(open_stream(user, job, HTTP_LAST_EVENT_ID=seen).streaming_content)
    assert "retry" in next(stream)
    services.report_progress(job, job.lease_token, 40, "resizing")
    assert next(stream)["data"]["progress"] == 40  # the snapshot it had is not sent again


def same_time_again(job: Any) -> Any:
    """The job's ``updated_at``: the next change is made at that time too (a coarse
    clock, or services given the same ``now``)."""
    return Job.objects.values_list("updated_at", flat=True).get(pk=job.pk)


@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 2})
def test_a_change_at_the_same_time_as_the_last_one_is_sent_too(user):
    # The stream compared updated_at alone: this change was never sent.
    job = running(user)
    stream = events(open_stream(user, job).streaming_content)
    assert "retry" in next(stream)
    first = next(stream)
    services.report_progress(job, job.lease_token, 40, "resizing", now=same_time_again(job))
    update = next(stream)
    assert (update["event"], update["data"]["progress"]) == ("job", 40)
    assert update["data"]["updated_at"] == first["data"]["updated_at"] and update["id"] != first["id"]


@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 2})
def test_a_reconnect_gets_a_change_made_at_the_same_time_as_the_event_it_has(user):
    job = running(user)
    seen = list(islice(events(open_stream(user, job).streaming_content), 2))[1]["id"]
    services.report_progress(job, job.lease_token, 40, "resizing", now=same_time_again(job))
    got = next(islice(events(open_stream(user, job, HTTP_LAST_EVENT_ID=seen).streaming_content), 1, 2))
    assert (got["event"], got["data"]["progress"]) == ("job", 40)


@override_settings(JOBSTATE=FAST)
def test_a_reconnect_without_the_final_event_of_a_job_that_ended_at_the_same_time_gets_it(user):
    # It got 204: the job's updated_at was the id it had, so it never saw the job end.
    job = running(user)
    seen = list(islice(events(open_stream(user, job).streaming_content), 2))[1]["id"]
    services.complete(job, job.lease_token, {"ok": True}, now=same_time_again(job))
    got = list(events(reconnect(user, job, seen).streaming_content))
    assert [(e["event"], e["data"]["status"]) for e in got[1:]] == [
        ("job", "completed"),
        ("end", "completed"),
    ]


def reconnect(user: Any, job: Any, last_event_id: str) -> Any:
    return client_for(user).get(
        job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream", HTTP_LAST_EVENT_ID=last_event_id
    )


@override_settings(JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": 1})
def test_a_reconnect_that_has_a_finished_jobs_final_event_gets_204_and_holds_no_stream(user, staff_user):
    # It got `end` again and the stream closed: an EventSource whose page does not close()
    # on `end` reconnected every second or so, forever (204 stops it: the SSE specification).
    job = completed(user)
    # The final event's id, as another client of the job's got it (the user's one stream stays free).
    final = list(events(open_stream(grant(staff_user, "view_job"), job).streaming_content))[1]["id"]
    open_stream(user, running(user))  # the user's one stream, held
    response = reconnect(user, job, final)
    assert response.status_code == 204 and response.content == b""
    assert response["Cache-Control"] == "no-cache"


@override_settings(JOBSTATE=FAST)
def test_a_reconnect_to_a_finished_job_without_its_final_event_gets_it_then_end(user):
    job = running(user)
    earlier = list(islice(events(open_stream(user, job).streaming_content), 2))[1]["id"]
    services.complete(job, job.lease_token, {"ok": True})
    for last_event_id in (earlier, "not-an-event-id"):
        got = list(events(open_stream(user, job, HTTP_LAST_EVENT_ID=last_event_id).streaming_content))
        assert [(e["event"], e["data"]["status"]) for e in got[1:]] == [
            ("job", "completed"),
            ("end", "completed"),
        ]


@override_settings(JOBSTATE=FAST)
def test_a_reconnect_to_another_users_finished_job_is_a_404(user, other_user):
    job = completed(other_user)
    final = list(events(open_stream(other_user, job).streaming_content))[1]["id"]
    assert reconnect(user, job, final).status_code == 404


@override_settings(JOBSTATE=FAST)
def test_the_stream_ends_if_the_job_is_deleted(user):
    job = make_job(user)
    stream = events(open_stream(user, job).streaming_content)
    next(stream), next(stream)
    job.delete()
    assert next(stream) == {"event": "end", "data": {"reason": "deleted"}}


def test_stream_errors_before_it_starts(user, other_user):
    job = make_job(other_user)
    response = client_for(user).get(job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 404
    assert response.content.startswith(b"event: error\ndata: ")
    response = client_for(None).get(job_url(job, "events/stream/"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_options_of_the_stream_is_json_whatever_it_accepts(user: Any) -> None:
    # With Accept: text/event-stream the metadata came wrapped in an "event: error" block (200).
    url = job_url(make_job(user), "events/stream/")
    as_json = client_for(user).options(url, HTTP_ACCEPT="application/json")
    as_events = client_for(user).options(url, HTTP_ACCEPT="text/event-stream")
    assert as_events.status_code == as_json.status_code == 200
    assert as_events["Content-Type"] == as_json["Content-Type"] == "application/json"
    assert as_events.content == as_json.content
    assert as_events.json()["renders"] == ["application/json", "text/event-stream"]


@contextmanager
def served(method: str, user: Any, path: str) -> Iterator[tuple[str, dict[str, str], Any]]:
    """The WSGI application's answer as a server gets it: status, headers and the body
    iterable, which a server reads to the end for a HEAD too (runserver, gunicorn)."""
    token, _ = Token.objects.get_or_create(user=user)
    environ = RequestFactory().generic(method, path, HTTP_AUTHORIZATION=f"Token {token.key}").environ
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.extend([status, headers])

    # As the test client: the test's transaction stays open across the request.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        body = WSGIHandler()(environ, start_response)
        try:
            yield started[0], dict(started[1]), body
        finally:
            body.close()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 30, "API_MAX_STREAMS_PER_USER": 1})
def test_a_head_gets_the_stream_headers_without_polling_or_taking_a_stream(user: Any) -> None:
    # A HEAD ran the stream: the server read its body to the end, polling the job
    # for up to SSE_MAX_SECONDS (a thread and one of the user's streams held) to send nothing.
    job = make_job(user)
    with served("HEAD", user, job_url(job, "events/stream/")) as (status, headers, body):
        assert status.startswith("200")
        assert headers["Content-Type"].startswith("text/event-stream")
        assert (headers["Cache-Control"], headers["X-Accel-Buffering"]) == ("no-cache", "no")
        assert next(iter(body), None) is None  # nothing to read, no poll
        open_stream(user, job)  # the user's one stream is free


def test_a_head_of_another_users_stream_is_a_404_as_its_get(user: Any, other_user: Any) -> None:
    with served("HEAD", user, job_url(make_job(other_user), "events/stream/")) as (status, _, _):
        assert status.startswith("404")


@override_settings(JOBSTATE=FAST)
def test_a_projects_gzip_middleware_leaves_the_stream_as_it_is(user: Any, settings: Any) -> None:
    # GZipMiddleware compressed the stream: zlib keeps what it is given until a block
    # fills, so no event (nor keep-alive) reached the client before the stream ended.
    settings.MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", *settings.MIDDLEWARE]
    job = running(user)
    response = open_stream(user, job, HTTP_ACCEPT_ENCODING="gzip, deflate")
    assert "Content-Encoding" not in response
    stream = events(response.streaming_content)
    assert "retry" in next(stream)
    assert next(stream)["data"]["status"] == "processing"
    services.report_progress(job, job.lease_token, 40, "resizing")
    assert next(stream)["data"]["progress"] == 40
    response.close()


SERVER_ERROR = {"error": {"code": "server_error", "message": "Internal server error.", "fields": {}}}


def fail_second_read(monkeypatch: Any) -> None:
    from django.db import ProgrammingError

    from jobstate.api import stream as stream_module

    read = stream_module.snapshot
    reads: list[Any] = []

    def flaky(job_id: Any) -> Any:
        reads.append(job_id)
        if len(reads) == 2:
            # A bug; a failed connection ends it with a 503 (test_api_database_unavailable).
            raise ProgrammingError('column "progress" does not exist (secret detail)')
        return read(job_id)

    monkeypatch.setattr(stream_module, "snapshot", flaky)


@override_settings(JOBSTATE=FAST)
def test_a_database_error_mid_stream_ends_it_with_an_error_event(user, monkeypatch, caplog):
    # The stream used to end as if closed normally: no client could tell a failure.
    fail_second_read(monkeypatch)
    job = running(user)
    got = list(events(open_stream(user, job).streaming_content))
    assert "retry" in got[0] and got[1]["event"] == "job"
    assert got[2:] == [{"event": "error", "data": SERVER_ERROR}]  # nothing of the exception
    logged = [r for r in caplog.records if r.name == "jobstate.api" and r.levelname == "ERROR"]
    assert len(logged) == 1 and "secret detail" in str(logged[0].exc_info[1])


@override_settings(JOBSTATE=FAST)
def test_a_database_error_mid_async_stream_ends_it_with_an_error_event(user, monkeypatch, caplog):
    from asgiref.sync import async_to_sync

    from jobstate.api import stream as stream_module

    fail_second_read(monkeypatch)
    job = running(user)

    async def read() -> list[bytes]:
        return [chunk async for chunk in stream_module.aevent_stream(job.pk)]

    got = list(events(iter(async_to_sync(read)())))
    assert "retry" in got[0] and got[1]["event"] == "job"
    assert got[2:] == [{"event": "error", "data": SERVER_ERROR}]
    assert [r.levelname for r in caplog.records if r.name == "jobstate.api"] == ["ERROR"]
