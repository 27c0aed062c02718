"""REST API: a request whose database connection fails (PostgreSQL down or restarting:
refused, ended by the server, none to be had) answers a 503 ``database_unavailable``
with ``Retry-After``, logged as a one-line warning, as a busy database answers its 503;
a progress stream ends with that body as its ``error`` event, a long-poll answers it.
Simulated by patching, so the same on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors
import pytest
from asgiref.sync import async_to_sync
from django.db import InterfaceError, OperationalError
from django.test import override_settings

from jobstate.api import longpoll, throttling
from jobstate.api import stream as stream_module
from jobstate.api.errors import UNAVAILABLE_RETRY_AFTER
from jobstate.models import Job
from tests.api_support import JOBS, assert_error, client_for, job_url, make_job, running
from tests.test_api_access import operational_error
from tests.test_api_stream import FAST, events, open_stream
from tests.test_api_stream_busy import busy_second_read, logged


class PoolTimeout(psycopg.OperationalError):
    """As psycopg_pool's (not a dependency of jobstate): no pool gave a connection in time."""


pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

REFUSED = psycopg.OperationalError(
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused\n'
    "\tIs the server running on that host and accepting TCP/IP connections?"
)
TERMINATED = psycopg.errors.AdminShutdown("terminating connection due to administrator command")

DISCONNECTED = [
    operational_error(REFUSED),
    operational_error(TERMINATED),
    operational_error(psycopg.errors.CrashShutdown("terminating connection because of crash")),
    operational_error(psycopg.errors.CannotConnectNow("the database system is starting up")),
    operational_error(psycopg.errors.ConnectionFailure("server closed the connection unexpectedly")),
    operational_error(psycopg.errors.ConnectionException("connection exception")),
    operational_error(PoolTimeout("couldn't get a connection after 30.00 sec")),
    operational_error(psycopg.InterfaceError("connection already closed"), InterfaceError),
    OperationalError("connection refused"),
]

MESSAGE = "The database is unavailable; try again after Retry-After seconds."
UNAVAILABLE = {
    "retry": str(UNAVAILABLE_RETRY_AFTER * 1000),
    "event": "error",
    "data": {"error": {"code": "database_unavailable", "message": MESSAGE, "fields": {}}},
}


def assert_unavailable(response: Any) -> None:
    error = assert_error(response, 503, "database_unavailable")
    assert error == {"code": "database_unavailable", "message": MESSAGE, "fields": {}}
    assert response["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER) == "5"


def assert_one_warning(caplog: Any, *words: str) -> None:
    # Not a bug: one line at WARNING, no traceback (an outage would log one a request).
    records = [r for r in caplog.records if r.name == "jobstate.api"]
    assert [r.levelname for r in records] == ["WARNING"]
    message = records[0].getMessage()
    assert records[0].exc_info is None and "\n" not in message
    assert all(word in message for word in words), message


@pytest.mark.parametrize("exc", DISCONNECTED, ids=lambda exc: type(exc.__cause__ or exc).__name__)
def test_a_failed_database_connection_is_a_503_to_retry(user, monkeypatch, caplog, exc):
    # It was a 500 server_error, logged with its traceback as an unhandled error.
    def down(*args: Any, **kwargs: Any) -> Any:
        raise exc

    job = make_job(user)
    monkeypatch.setattr("jobstate.api.views.services.request_cancel", down)
    assert_unavailable(client_for(user).post(f"{JOBS}{job.pk}/cancel/"))
    assert Job.objects.get(pk=job.pk).status == job.status
    assert_one_warning(caplog, "Database unavailable", "JobViewSet", " ".join(str(exc).split()))


def test_a_connection_refused_as_the_request_authenticates_is_a_503(user, monkeypatch, caplog):
    client = client_for(user)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise operational_error(REFUSED)

    monkeypatch.setattr("rest_framework.authentication.TokenAuthentication.authenticate_credentials", down)
    assert_unavailable(client.get(JOBS))
    assert_one_warning(caplog, "Connection refused Is the server running")


def test_a_connection_refused_before_a_stream_opens_is_a_503_event(user, monkeypatch):
    job = running(user)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise operational_error(REFUSED)

    monkeypatch.setattr("jobstate.api.views.visible_jobs", down)
    response = client_for(user).get(job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert list(events(iter([response.content]))) == [{"event": "error", "data": UNAVAILABLE["data"]}]


@pytest.mark.parametrize("cause", [REFUSED, TERMINATED], ids=lambda cause: type(cause).__name__)
@override_settings(JOBSTATE=FAST)
def test_a_failed_connection_mid_stream_ends_it_with_the_503_to_retry(user, monkeypatch, caplog, cause):
    # It ended with the 500 server_error event, logged at ERROR as a bug.
    busy_second_read(monkeypatch, cause)
    job = running(user)
    got = list(events(open_stream(user, job).streaming_content))
    assert "retry" in got[0] and got[1]["event"] == "job"
    assert got[2:] == [UNAVAILABLE]
    assert_one_warning(caplog, f"Progress stream of job {job.pk} stopped: database unavailable")


@override_settings(JOBSTATE=FAST)
def test_a_failed_connection_mid_async_stream_ends_it_with_the_503_to_retry(user, monkeypatch, caplog):
    busy_second_read(monkeypatch, TERMINATED)
    job = running(user)

    async def read() -> list[bytes]:
        return [chunk async for chunk in stream_module.aevent_stream(job.pk)]

    got = list(events(iter(async_to_sync(read)())))
    assert got[2:] == [UNAVAILABLE]
    assert logged(caplog) == ["WARNING"]


@override_settings(JOBSTATE={**FAST, "LONGPOLL_MAX_SECONDS": 5, "API_MAX_STREAMS_PER_USER": 1})
def test_a_long_poll_whose_database_went_away_answers_the_503_to_retry(user, monkeypatch, caplog):
    from jobstate.api import views

    job = make_job(user)

    def down(*args: Any) -> bool:
        monkeypatch.setattr(views.JobViewSet, "get_queryset", broken)  # the detail's read too
        raise operational_error(REFUSED)

    def broken(self: Any) -> Any:
        raise operational_error(REFUSED)

    monkeypatch.setattr(longpoll, "_changed", down)
    assert_unavailable(client_for(user).get(job_url(job), {"wait": 3}))
    assert throttling.hold_stream_slot(user) is not None  # the slot came back
    # The wait's warning and the answer's, one line each: no traceback for an outage.
    records = [r for r in caplog.records if r.name == "jobstate.api"]
    assert [r.levelname for r in records] == ["WARNING", "WARNING"]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert f"Long-poll of job {job.pk} stopped waiting: connection failed" in records[0].getMessage()


def test_the_schema_documents_the_503_of_a_failed_connection(user):
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    for path, method in (
        ("/api/jobs/", "post"),
        ("/api/jobs/{id}/", "get"),
        ("/api/jobs/{id}/events/stream/", "get"),
    ):
        description = schema["paths"][path][method]["responses"]["503"]["description"]
        assert "`database_busy`" in description and "`database_unavailable`" in description
    stream = schema["paths"]["/api/jobs/{id}/events/stream/"]["get"]["description"]
    assert "`database_unavailable`" in stream
