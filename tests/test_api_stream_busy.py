"""REST API: a progress stream whose poll the database is too busy for (SQLite's
"database is locked", PostgreSQL's lock timeout, deadlock or serialization failure)
ends as the other endpoints answer that error: the 503 ``database_busy`` body, with
SSE's ``retry`` (the reconnection time) set to their ``Retry-After``; a long-poll's
answers that 503 if the database is still busy once its wait stopped."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from jobstate.api import longpoll, throttling
from jobstate.api import stream as stream_module
from jobstate.api.errors import BUSY_RETRY_AFTER
from tests.api_support import assert_error, client_for, job_url, make_job, running
from tests.test_api_access import CONTENTION, operational_error
from tests.test_api_stream import FAST, events, open_stream

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

BUSY = {
    "retry": str(BUSY_RETRY_AFTER * 1000),
    "event": "error",
    "data": {
        "error": {
            "code": "database_busy",
            "message": "The database is busy with other writes; try again after Retry-After seconds.",
            "fields": {},
        }
    },
}


def busy_second_read(monkeypatch: Any, cause: Exception) -> None:
    read = stream_module.snapshot
    reads: list[Any] = []

    def busy(job_id: Any) -> Any:
        reads.append(job_id)
        if len(reads) == 2:
            raise operational_error(cause)
        return read(job_id)

    monkeypatch.setattr(stream_module, "snapshot", busy)


def logged(caplog: Any) -> list[str]:
    return [r.levelname for r in caplog.records if r.name == "jobstate.api"]


@pytest.mark.parametrize("cause", CONTENTION, ids=lambda cause: type(cause).__name__)
@override_settings(JOBSTATE=FAST)
def test_a_busy_database_mid_stream_ends_it_with_the_503_to_retry(
    user: Any, monkeypatch: Any, caplog: Any, cause: Exception
) -> None:
    # It was the 500 server_error, logged as a bug: nothing told the client to retry.
    busy_second_read(monkeypatch, cause)
    job = running(user)
    got = list(events(open_stream(user, job).streaming_content))
    assert "retry" in got[0] and got[1]["event"] == "job"
    assert got[2:] == [BUSY]
    assert logged(caplog) == ["WARNING"] and "database busy" in caplog.text


@override_settings(JOBSTATE=FAST)
def test_a_busy_database_mid_async_stream_ends_it_with_the_503_to_retry(
    user: Any, monkeypatch: Any, caplog: Any
) -> None:
    busy_second_read(monkeypatch, CONTENTION[0])
    job = running(user)

    async def read() -> list[bytes]:
        return [chunk async for chunk in stream_module.aevent_stream(job.pk)]

    got = list(events(iter(async_to_sync(read)())))
    assert got[2:] == [BUSY]
    assert logged(caplog) == ["WARNING"]


@override_settings(JOBSTATE={**FAST, "LONGPOLL_MAX_SECONDS": 5, "API_MAX_STREAMS_PER_USER": 1})
def test_a_long_poll_on_a_database_still_busy_answers_the_503_to_retry(user: Any, monkeypatch: Any) -> None:
    from jobstate.api import views

    job = make_job(user)

    def busy(*args: Any) -> bool:
        monkeypatch.setattr(views.JobViewSet, "get_queryset", broken)  # the detail's read too
        raise operational_error(CONTENTION[0])

    def broken(self: Any) -> Any:
        raise operational_error(CONTENTION[0])

    monkeypatch.setattr(longpoll, "_changed", busy)
    response = client_for(user).get(job_url(job), {"wait": 3})
    assert_error(response, 503, "database_busy")
    assert response["Retry-After"] == str(BUSY_RETRY_AFTER)
    assert throttling.hold_stream_slot(user) is not None  # the slot came back
