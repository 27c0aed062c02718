"""REST API: hostile input never reaches the database (NUL characters), and the
endpoints that hold a server thread (progress stream, long-poll) are limited per
user: a default rate and a cap on how many are open at once."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest
from django.core.cache import cache
from django.core.signals import request_finished
from django.db import close_old_connections, connection
from django.test import override_settings
from django.utils import timezone
from rest_framework.exceptions import Throttled
from rest_framework.test import APIClient

from jobstate.api import longpoll, throttling
from jobstate.api import stream as stream_module
from jobstate.api.stream import HeldStream
from jobstate.models import Asset, Job, JobEvent
from tests.api_support import JOBS, assert_error, client_for, completed, job_url, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

# Every query parameter the API reads, and some it does not.
PARAMETERS = [
    "kind",
    "key",
    "status",
    "created_after",
    "created_before",
    "parent",
    "retry_of",
    "ordering",
    "cursor",
    "page_size",
    "wait",
    "since",
    "reason",
    "search",
    "anything",
]
GETS = [
    "/api/",
    JOBS,
    "/api/jobs/stuck/",
    "/api/jobs/{job}/",
    "/api/jobs/{job}/events/",
    "/api/jobs/{job}/events/stream/",
    "/api/jobs/{job}/assets/",
    "/api/assets/",
    "/api/assets/{asset}/",
    "/api/assets/{asset}/download/",
]
POSTS = [JOBS, "/api/jobs/{job}/cancel/", "/api/jobs/{job}/retry/", "/api/jobs/{job}/fail/"]


@pytest.fixture
def objects(user: Any, settings: Any, tmp_path: Any) -> dict[str, Any]:
    from jobstate import services

    settings.MEDIA_ROOT = tmp_path
    job = completed(user)
    asset = services.add_asset(job, asset_type="out", name="o.txt", content=b"hello")
    return {"job": job.pk, "asset": asset.pk}


def counts() -> tuple[int, int, int]:
    return Job.objects.count(), JobEvent.objects.count(), Asset.objects.count()


@pytest.mark.parametrize("path", GETS)
@pytest.mark.parametrize("value", ["%00", "a%00b", "test.echo%00"])
def test_a_nul_in_any_query_parameter_is_a_400(
    user: Any, objects: dict[str, Any], path: str, value: str
) -> None:
    client = client_for(user)
    for name in PARAMETERS:
        response = client.get(f"{path.format(**objects)}?{name}={value}", HTTP_ACCEPT="application/json")
        error = assert_error(response, 400, "invalid")
        assert error["fields"] == {name: ["Null characters are not allowed."]}, (path, name)


@pytest.mark.parametrize("path", POSTS)
def test_a_nul_in_a_query_parameter_of_a_write_changes_nothing(
    user: Any, objects: dict[str, Any], path: str
) -> None:
    before = counts()
    body = {"kind": "test.echo", "reason": "because"}
    response = client_for(user).post(f"{path.format(**objects)}?key=%00", body, format="json")
    assert_error(response, 400, "invalid")
    assert counts() == before


def test_a_nul_in_a_parameter_name_is_a_400(user: Any) -> None:
    assert_error(client_for(user).get(f"{JOBS}?kind%00=x"), 400, "invalid")


def test_a_nul_in_the_token_is_a_401_not_a_database_error(user: Any) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token abc\x00def")
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    assert "Null characters" in error["message"]


@pytest.mark.parametrize("path", [*GETS, *POSTS])
def test_more_query_parameters_than_django_takes_is_a_400_that_changes_nothing(
    user: Any, objects: dict[str, Any], settings: Any, path: str
) -> None:
    # Django's TooManyFieldsSent, raised when the view first read them, was a 500.
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    before = counts()
    query = "&".join(f"status=queued&p{i}=1" for i in range(6))
    url = f"{path.format(**objects)}?{query}"
    client = client_for(user)
    if path in POSTS:
        response = client.post(url, {"kind": "test.echo", "reason": "because"}, format="json")
    else:
        response = client.get(url, HTTP_ACCEPT="application/json")
    error = assert_error(response, 400, "invalid")
    assert error["message"] == "Too many parameters: at most 10."
    assert counts() == before


# --- streams and long-polls -------------------------------------------------------

FAST = {"SSE_POLL_SECONDS": 0.01, "SSE_MAX_SECONDS": 0.05, "LONGPOLL_MAX_SECONDS": 0.05}


def stream(client: APIClient, job: Any) -> Any:
    return client.get(job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream")


def hang_up(response: Any) -> None:
    """Close the response as a WSGI server does when the client goes away (keeping
    the test's database connection open, as the test client itself does)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def test_the_stream_scope_has_a_rate_by_default() -> None:
    assert throttling.DEFAULT_RATES["jobstate_stream"] == "120/minute"
    assert throttling.max_streams() == 5


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {}})
def test_streams_and_long_polls_are_throttled_without_any_setting(user: Any, monkeypatch: Any) -> None:
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "3/minute")
    job = completed(user)
    client = client_for(user)
    assert b"".join(stream(client, job).streaming_content)
    assert b"".join(stream(client, job).streaming_content)
    assert client.get(job_url(job), {"wait": 1}).status_code == 200
    response = client.get(job_url(job), {"wait": 1})
    assert_error(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    assert stream(client, job).status_code == 429
    # Everything else is another scope (unlimited here), and so is a detail without wait.
    assert client.get(job_url(job)).status_code == 200
    assert client.get(job_url(job), {"wait": 0}).status_code == 200
    assert client.get(JOBS).status_code == 200


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {}})
def test_a_refused_long_poll_does_not_count_against_the_stream_rate(user: Any, monkeypatch: Any) -> None:
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "1/minute")
    job = completed(user)
    client = client_for(user)
    url = job_url(job)
    refused = ["wait=1e9", "wait=inf", "wait=1&wait=2", "wait=1&since=yesterday", "wait=1&since=a&since=b"]
    for query in refused:
        assert_error(client.get(f"{url}?{query}"), 400, "invalid")
    assert client.get(url, {"wait": 1}).status_code == 200  # the scope's one request
    assert_error(client.get(url, {"wait": 1}), 429, "throttled")


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"jobstate_stream": None}})
def test_a_none_rate_turns_the_stream_scope_off(user: Any, monkeypatch: Any) -> None:
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "1/minute")
    job = completed(user)
    client = client_for(user)
    for _ in range(3):
        assert b"".join(stream(client, job).streaming_content)


@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 5, "API_MAX_STREAMS_PER_USER": 2})
def test_a_user_holds_at_most_so_many_streams_and_long_polls_at_once(user: Any, other_user: Any) -> None:
    job = make_job(user)  # queued: its stream stays open until closed
    client = client_for(user)
    first, second = stream(client, job), stream(client, job)
    assert (first.status_code, second.status_code) == (200, 200)
    refused = stream(client, job)  # an EventSource gets the error as an event
    assert refused.status_code == 429 and refused.content.startswith(b"event: error\ndata: ")
    assert b'"code": "throttled"' in refused.content
    error = assert_error(client.get(job_url(job, "events/stream/")), 429, "throttled")
    assert (
        "At most 2" in error["message"] and int(client.get(job_url(job, "events/stream/"))["Retry-After"]) > 0
    )
    assert_error(client.get(job_url(job), {"wait": 1}), 429, "throttled")
    assert client.get(job_url(job)).status_code == 200  # a plain detail holds nothing
    theirs = make_job(other_user)
    assert stream(client_for(other_user), theirs).status_code == 200  # per user
    hang_up(first)
    third = stream(client, job)
    assert third.status_code == 200
    hang_up(second)
    hang_up(third)


@override_settings(JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": 1})
def test_slots_come_back_when_streams_end_or_are_dropped(user: Any) -> None:
    job = completed(user)
    client = client_for(user)
    for _ in range(3):  # read to the end: closed by the server
        assert b"".join(stream(client, job).streaming_content).endswith(b"\n\n")
    for _ in range(3):  # closed by the server before it was read (the client went away)
        hang_up(stream(client, job))
    for _ in range(3):  # a long-poll holds its slot only while it waits
        assert client.get(job_url(make_job(user)), {"wait": 0.01}).status_code == 200


@override_settings(JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": 1})
def test_a_stream_nobody_closes_gives_its_slot_back_when_collected(user: Any) -> None:
    slot = throttling.hold_stream_slot(user)
    held = HeldStream(iter([b"event"]), slot)
    with pytest.raises(Throttled):
        throttling.hold_stream_slot(user)
    del held
    gc.collect()
    assert slot is not None and not slot.held
    again = throttling.hold_stream_slot(user)
    assert again is not None
    again.release()
    again.release()  # idempotent: the count does not go below what is open
    assert throttling.hold_stream_slot(user) is not None


@override_settings(JOBSTATE={**FAST, "LONGPOLL_MAX_SECONDS": 30, "API_MAX_STREAMS_PER_USER": 1})
def test_a_long_poll_cancelled_before_it_waits_gives_its_slot_back(user: Any) -> None:
    # Under ASGI a client that goes away cancels the request's task. Cancelled while the
    # detail view (in its thread) took the slot, the long-poll never saw its WaitFirst:
    # the slot stayed held until its cache entry expired (the whole wait, 30 s here).
    import asyncio
    import threading
    from unittest import mock

    taken = threading.Event()

    def view(request: Any) -> longpoll.WaitFirst:
        slot = throttling.hold_stream_slot(user, throttling.long_poll_seconds(30))
        taken.set()
        time.sleep(0.2)  # the task is cancelled meanwhile
        return longpoll.WaitFirst("job", timezone.now(), 30, slot, mock.Mock())

    async def cancelled() -> None:
        task = asyncio.ensure_future(longpoll.long_poll_view(view)(mock.Mock()))
        while not taken.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    deadline = time.monotonic() + 2  # the view's thread may still be returning
    while True:
        gc.collect()
        try:
            again = throttling.hold_stream_slot(user)
            break
        except Throttled:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    assert again is not None
    again.release()


@override_settings(JOBSTATE={**FAST, "SSE_MAX_SECONDS": 0.3, "SSE_POLL_SECONDS": 0.05})
def test_a_stream_read_past_its_slots_time_stops_without_another_poll(user: Any, monkeypatch: Any) -> None:
    # A slow reader: the WSGI server's write of a chunk blocks until the slot's time
    # is over. The stream then polled once more and wrote its end, a write that could
    # block as long again, after the slot had expired and let the user's next stream in.
    polls: list[Any] = []
    read = stream_module.snapshot
    monkeypatch.setattr(stream_module, "snapshot", lambda job_id: polls.append(job_id) or read(job_id))
    job = make_job(user)  # queued: the stream stays open
    response = stream(client_for(user), job)
    chunks = iter(response.streaming_content)
    assert next(chunks).startswith(b"retry:") and next(chunks).startswith(b"event: job")
    time.sleep(throttling.stream_seconds() + 0.05)  # the write of that chunk returns late
    assert list(chunks) == [] and len(polls) == 1
    hang_up(response)
    assert throttling.hold_stream_slot(user) is not None  # given back


@override_settings(JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": None})
def test_the_stream_cap_can_be_turned_off(user: Any) -> None:
    job = make_job(user)
    client = client_for(user)
    opened = [stream(client, job) for _ in range(8)]
    assert {r.status_code for r in opened} == {200}
    for response in opened:
        hang_up(response)


@override_settings(
    JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": 1},
    CACHES={"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}},
)
def test_a_cache_that_keeps_nothing_does_not_block_streams(user: Any) -> None:
    job = make_job(user)
    client = client_for(user)
    opened = [stream(client, job) for _ in range(3)]
    assert {r.status_code for r in opened} == {200}
    for response in opened:
        hang_up(response)


@override_settings(
    JOBSTATE={**FAST, "SSE_MAX_SECONDS": 40, "LONGPOLL_MAX_SECONDS": 30, "API_MAX_STREAMS_PER_USER": 2}
)
def test_retry_after_says_when_the_first_held_slot_ends(user: Any) -> None:
    job = make_job(user)
    client = client_for(user)
    first = stream(client, job)
    held = throttling.hold_stream_slot(user, throttling.long_poll_seconds(10))  # a long-poll of 10 s
    refused = client.get(job_url(job, "events/stream/"))
    assert_error(refused, 429, "throttled")
    # The long-poll's slot ends first: 10 s (+ a poll and the grace), not the stream's 40.
    assert 10 <= int(refused["Retry-After"]) <= 10 + 1 + throttling.SLOT_GRACE_SECONDS
    assert held is not None
    held.release()
    hang_up(first)
    both = [stream(client, job), stream(client, job)]
    refused = client.get(job_url(job), {"wait": 5})
    assert_error(refused, 429, "throttled")
    assert 40 <= int(refused["Retry-After"]) <= 40 + 1 + throttling.SLOT_GRACE_SECONDS
    for response in both:
        hang_up(response)
    assert stream(client, job).status_code == 200  # free again at once, not after Retry-After


@override_settings(JOBSTATE={**FAST, "API_MAX_STREAMS_PER_USER": 1})
def test_a_released_slot_is_not_freed_twice_after_it_expired(user: Any) -> None:
    old = throttling.hold_stream_slot(user, 0.1)
    assert old is not None
    cache.delete(old.key)  # expired; another request takes the slot
    new = throttling.hold_stream_slot(user)
    assert new is not None and new.key == old.key
    old.release()  # must not free the new holder's slot
    with pytest.raises(Throttled):
        throttling.hold_stream_slot(user)
    new.release()
    assert throttling.hold_stream_slot(user) is not None


@pytest.mark.django_db(transaction=True)
@override_settings(JOBSTATE={**FAST, "LONGPOLL_MAX_SECONDS": 0.3})
def test_a_long_poll_waits_outside_any_transaction_under_atomic_requests(user: Any, monkeypatch: Any) -> None:
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    seen: list[bool] = []
    real = longpoll._changed

    def spy(job_id: Any, since: Any) -> bool:
        seen.append(connection.in_atomic_block)
        return real(job_id, since)

    monkeypatch.setattr(longpoll, "_changed", spy)
    job = make_job(user)
    response = client_for(user).get(job_url(job), {"wait": 1})
    assert response.status_code == 200, response.content
    assert len(seen) >= 2 and not any(seen)
    assert client_for(user).get(job_url(job)).status_code == 200  # a plain detail too


@override_settings(JOBSTATE={**FAST, "LONGPOLL_MAX_SECONDS": 5, "API_MAX_STREAMS_PER_USER": 1})
def test_a_long_poll_whose_wait_fails_answers_with_the_detail_and_frees_its_slot(
    user: Any, monkeypatch: Any
) -> None:
    from django.db import OperationalError

    def broken(job_id: Any, since: Any) -> bool:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(longpoll, "_changed", broken)
    job = make_job(user)
    response = client_for(user).get(job_url(job), {"wait": 3})
    assert response.status_code == 200 and response.json()["id"] == str(job.pk)
    assert throttling.hold_stream_slot(user) is not None  # the slot came back


@pytest.mark.parametrize("where", ["jobs", "events", "assets", "job-assets", "webhooks"])
def test_a_cursor_that_decodes_to_deeply_nested_json_is_a_400(user, where):
    # json.loads of the cursor raised RecursionError: a 500 on every paged list.
    import base64

    job = make_job(user)
    url = {
        "jobs": JOBS,
        "events": job_url(job, "events/"),
        "assets": "/api/assets/",
        "job-assets": job_url(job, "assets/"),
        "webhooks": "/api/webhooks/",
    }[where]
    for depth in (400, 1500):  # 1,500 levels: a 2,000-character cursor, a normal URL
        cursor = base64.urlsafe_b64encode(b"[" * depth + b"]" * depth).decode().rstrip("=")
        response = client_for(user).get(url, {"cursor": cursor})
        assert "cursor" in assert_error(response, 400, "invalid")["fields"]


def test_a_body_nested_a_little_less_deep_than_the_parser_allows_is_a_400(user):
    # Parsed, then a serializer's error message (the repr of the value) recursed too
    # deep: a 500 on POST /api/webhooks/ for depths just under the parser's limit.
    from jobstate.webhooks.models import WebhookEndpoint

    client = client_for(user)
    for depth in (201, 850, 915, 990):
        events = "[" * depth + '"job.completed"' + "]" * depth
        body = '{"url": "https://example.org/x", "events": ' + events + "}"
        response = client.post("/api/webhooks/", body, content_type="application/json")
        assert assert_error(response, 400, "parse_error")
    assert not WebhookEndpoint.objects.exists()
    # A job's parameters may still hold 100 levels inside the body.
    deep: Any = {}
    for _ in range(99):
        deep = {"a": deep}
    assert client.post(JOBS, {"kind": "test.echo", "parameters": deep}, format="json").status_code == 201


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"jobstate_enqueue": "2/minute"}})
def test_a_retry_counts_against_the_enqueue_rate(user):
    # POST /jobs/{id}/retry/ makes a new job each time, and went around the limit.
    from tests.api_support import failed

    client = client_for(user)
    dead = failed(user)
    assert client.post(JOBS, {"kind": "test.echo"}, format="json").status_code == 201
    assert client.post(job_url(dead, "retry/"), {}, format="json").status_code == 201
    before = Job.objects.count()
    assert_error(client.post(job_url(dead, "retry/"), {}, format="json"), 429, "throttled")
    assert_error(client.post(JOBS, {"kind": "test.echo"}, format="json"), 429, "throttled")
    assert Job.objects.count() == before
