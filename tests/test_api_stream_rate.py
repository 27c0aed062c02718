"""REST API: the stream scope's rate (``jobstate_stream``) counts the progress streams
and long-polls a user opens; the requests to those endpoints that open none (a job the
caller cannot see, a 204 for a finished job the client has seen, a HEAD, a refusal for
too many open) count against a bucket of their own at the same rate: bounded, without
taking what real streams need."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from jobstate.api import stream as stream_module
from jobstate.api import throttling
from tests.api_support import assert_error, client_for, completed, job_url, make_job
from tests.test_api_limits import hang_up

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

FAST = {"SSE_POLL_SECONDS": 0.01, "SSE_MAX_SECONDS": 0.05, "LONGPOLL_MAX_SECONDS": 0.05}
NO_OTHER_RATES = {"DEFAULT_THROTTLE_RATES": {}}


def stream(client: Any, job: Any, **headers: str) -> Any:
    return client.get(job_url(job, "events/stream/"), **headers)  # errors as JSON


def probe(client: Any, mine: Any, theirs: Any) -> None:
    """One of each request that opens no stream: four in all."""
    assert_error(stream(client, theirs), 404, "not_found")
    assert_error(client.get(job_url(theirs), {"wait": 1}), 404, "not_found")
    final = stream_module.event_id(stream_module.snapshot(mine.pk))
    assert stream(client, mine, HTTP_LAST_EVENT_ID=final).status_code == 204
    assert client.head(job_url(mine, "events/stream/")).status_code == 200


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK=NO_OTHER_RATES)
def test_requests_that_open_no_stream_do_not_take_the_stream_rate(
    user: Any, other_user: Any, monkeypatch: Any
) -> None:
    # A 404 (a job the caller cannot see) or a 204 took one of the rate's requests: a
    # client's probes, or EventSources told to stop, left its real streams a 429.
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "4/minute")
    client = client_for(user)
    mine, theirs = completed(user), completed(other_user)
    probe(client, mine, theirs)
    # The rate's four requests are all still there for streams and long-polls.
    assert b"".join(stream(client, mine).streaming_content)
    assert client.get(job_url(mine), {"wait": 1}).status_code == 200
    assert b"".join(stream(client, mine).streaming_content)
    assert client.get(job_url(mine), {"wait": 1}).status_code == 200
    assert_error(stream(client, mine), 429, "throttled")


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK=NO_OTHER_RATES)
def test_requests_that_open_no_stream_are_bounded_by_a_bucket_of_their_own(
    user: Any, other_user: Any, monkeypatch: Any
) -> None:
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "4/minute")
    client = client_for(user)
    mine, theirs = completed(user), completed(other_user)
    probe(client, mine, theirs)
    # The fifth: a 429 whatever it asks for, with the rate's Retry-After.
    refused = assert_error(client.get(job_url(theirs, "events/stream/")), 429, "throttled")
    assert refused["message"].startswith("Request was throttled")
    response = client.get(job_url(theirs), {"wait": 1})
    assert_error(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    assert client.head(job_url(mine, "events/stream/")).status_code == 429
    # Per user, and the streams' own requests are untouched.
    assert_error(stream(client_for(other_user), mine), 404, "not_found")
    assert b"".join(stream(client, mine).streaming_content)


@override_settings(JOBSTATE=FAST, REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"jobstate_stream": None}})
def test_a_none_stream_rate_turns_the_probes_bucket_off_too(
    user: Any, other_user: Any, monkeypatch: Any
) -> None:
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "1/minute")
    client = client_for(user)
    theirs = completed(other_user)
    for _ in range(5):
        assert_error(stream(client, theirs), 404, "not_found")


@override_settings(
    JOBSTATE={**FAST, "SSE_MAX_SECONDS": 5, "API_MAX_STREAMS_PER_USER": 1}, REST_FRAMEWORK=NO_OTHER_RATES
)
def test_a_refusal_for_too_many_open_streams_counts_with_the_requests_that_open_none(
    user: Any, monkeypatch: Any
) -> None:
    # A stream or long-poll refused because the user's streams were all open took one of
    # the rate's requests: an EventSource retrying it left the user's next real stream a 429.
    monkeypatch.setitem(throttling.DEFAULT_RATES, "jobstate_stream", "3/minute")
    client = client_for(user)
    job = make_job(user)  # queued: its stream stays open
    first = stream(client, job)
    assert first.status_code == 200
    for response in (stream(client, job), client.get(job_url(job), {"wait": 1}), stream(client, job)):
        assert "At most 1" in assert_error(response, 429, "throttled")["message"]
    # Bounded all the same: the fourth refusal is the rate's.
    assert assert_error(stream(client, job), 429, "throttled")["message"].startswith("Request was throttled")
    hang_up(first)
    # The rate's other two requests are still there for streams and long-polls.
    assert client.get(job_url(completed(user)), {"wait": 1}).status_code == 200
    assert b"".join(stream(client, completed(user)).streaming_content)
    assert_error(stream(client, completed(user)), 429, "throttled")
    slot = throttling.hold_stream_slot(user)  # the slot that refused request took is back
    assert slot is not None
    slot.release()
