"""REST API: an open progress stream checks again, while it runs, that its client may
see the job (credentials, active user, visibility); it ends when that is lost."""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.test import RequestFactory, override_settings
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.test import APIClient

from jobstate import services
from jobstate.api import longpoll
from jobstate.api import stream as stream_module
from jobstate.api.access import StreamAccess
from tests.api_support import client_for, grant, job_url, running
from tests.test_api_stream import events

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

FAST = {"SSE_POLL_SECONDS": 0.02, "SSE_MAX_SECONDS": 2, "SSE_KEEPALIVE_SECONDS": 60}
SLOW = {"SSE_POLL_SECONDS": 0.5, "SSE_MAX_SECONDS": 60, "SSE_KEEPALIVE_SECONDS": 600}


class FakeClock:
    """The stream's clock and sleep: a sleep moves the time on at once."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: Any) -> FakeClock:
    fake = FakeClock()
    sync = functools.partial(stream_module.event_stream, clock=fake, sleep=fake.sleep)
    monkeypatch.setattr(stream_module, "event_stream", sync)
    return fake


@pytest.fixture
def every_poll(monkeypatch: Any) -> None:
    """Access checked at every poll: a test need not wait out the interval."""
    monkeypatch.setattr(stream_module, "ACCESS_CHECK_SECONDS", 0)


def open_stream(client: APIClient, job: Any) -> Iterator[dict[str, Any]]:
    response = client.get(job_url(job, "events/stream/"), HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200, response.content
    stream = events(response.streaming_content)
    assert "retry" in next(stream)
    assert next(stream)["event"] == "job"
    return stream


def refusal(client: APIClient, job: Any, status: int) -> dict[str, Any]:
    """What a new request of the stream gets now: the body the stream's last event sends."""
    response = client.get(job_url(job, "events/stream/"), HTTP_ACCEPT="application/json")
    assert response.status_code == status, response.content
    body: dict[str, Any] = response.json()
    return body


@override_settings(JOBSTATE=SLOW)
def test_a_stream_whose_token_is_deleted_stops_within_the_check_interval(user: Any, clock: FakeClock) -> None:
    # The stream sent the job's progress until SSE_MAX_SECONDS, whoever had lost access.
    job = running(user)
    client = client_for(user)
    stream = open_stream(client, job)
    Token.objects.filter(user=user).delete()
    lost_at = clock.now
    services.report_progress(job, job.lease_token, 40, "resizing")
    rest = [(event, clock.now) for event in stream]
    error, ended_at = rest[-1]
    assert error == {"event": "error", "data": refusal(client, job, 401)}
    assert error["data"]["error"]["code"] == "authentication_failed"
    assert ended_at - lost_at <= stream_module.ACCESS_CHECK_SECONDS
    # Before it: the job's events of the interval, at most; no `end` (the stream closes).
    assert {event.get("event") for event, _ in rest[:-1]} <= {"job"}


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
def test_a_stream_whose_user_is_made_inactive_sends_nothing_more_about_the_job(user: Any) -> None:
    job = running(user)
    client = client_for(user)
    stream = open_stream(client, job)
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    services.report_progress(job, job.lease_token, 40, "resizing")
    assert list(stream) == [{"event": "error", "data": refusal(client, job, 401)}]


def logged_in(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def change_owner(job: Any, other_user: Any) -> None:
    type(job).objects.filter(pk=job.pk).update(owner=other_user)


def set_password(user: Any) -> None:
    user.set_password("a-new-password-456")
    user.save()


def remove_permissions(user: Any) -> None:
    user.user_permissions.clear()


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
@pytest.mark.parametrize(
    ("session", "lose", "status"),
    [
        pytest.param(False, lambda user, client: Token.objects.filter(user=user).delete(), 401, id="token"),
        pytest.param(
            False,
            lambda user, client: (
                Token.objects.filter(user=user).delete(),
                Token.objects.create(user=user),
            ),
            401,
            id="token-rotated",
        ),
        pytest.param(True, lambda user, client: client.logout(), 401, id="logged-out"),
        pytest.param(True, lambda user, client: set_password(user), 401, id="password-changed"),
        pytest.param(
            True,
            lambda user, client: type(user).objects.filter(pk=user.pk).update(is_active=False),
            401,
            id="session-user-inactive",
        ),
        pytest.param(False, lambda user, client: remove_permissions(user), 404, id="staff-permission"),
    ],
)
def test_a_stream_ends_with_the_error_a_new_request_gets_once_access_is_lost(
    staff_user: Any, other_user: Any, session: bool, lose: Callable[..., Any], status: int
) -> None:
    staff = grant(staff_user, "view_job")
    job = running(other_user)  # seen through staff's permission, or as its owner below
    client = logged_in(staff) if session else client_for(staff)
    stream = open_stream(client, job)
    lose(staff, client)
    services.report_progress(job, job.lease_token, 40, "resizing")
    error = next(stream)
    assert error == {"event": "error", "data": refusal(client, job, status)}
    assert list(stream) == []


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
def test_a_stream_ends_when_its_job_is_given_to_another_owner(user: Any, other_user: Any) -> None:
    job = running(user)
    client = client_for(user)
    stream = open_stream(client, job)
    change_owner(job, other_user)
    services.report_progress(job, job.lease_token, 40, "resizing")
    assert list(stream) == [{"event": "error", "data": refusal(client, job, 404)}]


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
def test_a_stream_whose_access_stays_runs_on(user: Any) -> None:
    job = running(user)
    stream = open_stream(logged_in(user), job)
    services.report_progress(job, job.lease_token, 40, "resizing")
    assert next(stream)["data"]["progress"] == 40
    services.complete(job, job.lease_token, {"ok": True})
    assert [e["event"] for e in stream] == ["job", "end"]


@override_settings(JOBSTATE=SLOW)
def test_access_is_checked_at_most_once_per_interval_in_two_queries(
    user: Any, clock: FakeClock, monkeypatch: Any, django_assert_max_num_queries: Any
) -> None:
    checks: list[float] = []
    check = StreamAccess.refusal
    monkeypatch.setattr(StreamAccess, "refusal", lambda self: checks.append(clock.now) or check(self))
    job = running(user)
    started = clock.now
    got = list(open_stream(client_for(user), job))
    assert got[-1] == {"event": "end", "data": {"reason": "timeout"}}
    assert len(checks) == 60 / stream_module.ACCESS_CHECK_SECONDS  # not one per poll (120)
    assert checks[0] - started == stream_module.ACCESS_CHECK_SECONDS
    access = token_access(user, job)
    with django_assert_max_num_queries(2):  # the token and its user; the job
        assert access.refusal() is None


def token_access(user: Any, job: Any) -> StreamAccess:
    token, _ = Token.objects.get_or_create(user=user)
    django_request = RequestFactory().get("/", HTTP_AUTHORIZATION=f"Token {token.key}")
    request = Request(django_request, authenticators=[TokenAuthentication()])
    assert request.user.pk == user.pk
    return StreamAccess(request, job.pk)


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
def test_the_async_stream_checks_access_too(user: Any) -> None:
    job = running(user)
    access = token_access(user, job)
    Token.objects.filter(user=user).delete()

    async def read() -> list[bytes]:
        return [chunk async for chunk in stream_module.aevent_stream(job.pk, access=access.refusal)]

    got = list(events(iter(async_to_sync(read)())))
    assert "retry" in got[0]
    invalid_token = {"error": {"code": "authentication_failed", "message": "Invalid token.", "fields": {}}}
    assert got[1:] == [{"event": "error", "data": invalid_token}]


def test_permissions_are_read_again(staff_user: Any, other_user: Any) -> None:
    staff = grant(staff_user, "view_job")
    job = running(other_user)
    access = token_access(staff, job)
    assert access.refusal() is None
    staff.user_permissions.remove(Permission.objects.get(codename="view_job"))
    assert access.refusal() == {"error": {"code": "not_found", "message": "Not found.", "fields": {}}}


@override_settings(JOBSTATE=FAST)
@pytest.mark.usefixtures("every_poll")
@pytest.mark.parametrize(
    "lose", [set_password, lambda user: type(user).objects.filter(pk=user.pk).update(is_active=False)]
)
def test_a_basic_auth_stream_ends_when_the_password_changes_or_the_user_is_inactive(
    user: Any, settings: Any, monkeypatch: Any, lose: Callable[[Any], Any]
) -> None:
    # DRF's default authentication (a project without REST_FRAMEWORK settings).
    settings.REST_FRAMEWORK = {
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"]
    }
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"alice:pw-alice-123").decode())
    job = running(user)
    stream = open_stream(client, job)
    services.report_progress(job, job.lease_token, 20, "still the same password")
    assert next(stream)["data"]["progress"] == 20
    lose(user)
    assert list(stream) == [{"event": "error", "data": refusal(client, job, 401)}]


# The long-poll (GET /jobs/{id}/?wait=) --------------------------------------------------


@pytest.mark.parametrize(
    ("session", "lose", "status"),
    [
        pytest.param(False, lambda user, client: Token.objects.filter(user=user).delete(), 401, id="token"),
        pytest.param(
            False,
            lambda user, client: type(user).objects.filter(pk=user.pk).update(is_active=False),
            401,
            id="inactive",
        ),
        pytest.param(True, lambda user, client: client.logout(), 401, id="logged-out"),
        pytest.param(False, lambda user, client: remove_permissions(user), 404, id="staff-permission"),
    ],
)
def test_a_long_poll_that_loses_access_while_it_waits_answers_the_error_not_the_job(
    staff_user: Any, other_user: Any, monkeypatch: Any, session: bool, lose: Callable[..., Any], status: int
) -> None:
    # Its answer after the wait authenticated with the user of its first run, kept on the
    # request: the job's whole detail went to a client whose access was gone.
    staff = grant(staff_user, "view_job")
    job = running(other_user)
    client = logged_in(staff) if session else client_for(staff)

    async def wait_and_lose(*args: Any, **kwargs: Any) -> None:
        await sync_to_async(lose)(staff, client)

    monkeypatch.setattr(longpoll, "await_change", wait_and_lose)
    response = client.get(job_url(job), {"wait": 5})
    assert response.status_code == status, response.content
    assert response.json() == refusal(client, job, status)


def test_a_long_poll_whose_access_stays_answers_the_job(user: Any, monkeypatch: Any) -> None:
    job = running(user)

    async def wait_for_progress(*args: Any, **kwargs: Any) -> None:
        await sync_to_async(services.report_progress)(job, job.lease_token, 40, "resizing")

    monkeypatch.setattr(longpoll, "await_change", wait_for_progress)
    response = logged_in(user).get(job_url(job), {"wait": 5})
    assert response.status_code == 200 and response.json()["progress"] == 40
