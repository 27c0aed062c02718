"""REST API: every endpoint against owner, other user, staff and anonymous;
authentication, throttling and the error shape at the edges."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg.errors
import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, ProgrammingError
from django.test import override_settings
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobstate import services
from jobstate.api import base as api_base
from jobstate.models import Asset, Job
from tests.api_support import JOBS, assert_error, client_for, completed, grant, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

FAST = {"SSE_POLL_SECONDS": 0.01, "SSE_MAX_SECONDS": 0.05, "LONGPOLL_MAX_SECONDS": 0.05}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # {queued}, {running}, {done}, {asset}: the owner's objects
    owner: int  # status for the owner
    staff: int  # status for staff with jobstate.view_job only (no action permissions)
    body: dict[str, Any] | None = None
    listing: bool = False  # a list: other users get 200 with nothing of the owner's


ENDPOINTS = [
    Endpoint("get", "/api/jobs/", 200, 200, listing=True),
    Endpoint("post", "/api/jobs/", 201, 201, body={"kind": "test.echo", "parameters": {"a": 1}}),
    Endpoint("get", "/api/jobs/{queued}/", 200, 200),
    Endpoint("get", "/api/jobs/{queued}/?wait=0.05", 200, 200),
    Endpoint("post", "/api/jobs/{queued}/cancel/", 200, 403, body={"reason": "r"}),
    Endpoint("post", "/api/jobs/{running}/cancel/", 202, 403),
    Endpoint("post", "/api/jobs/{done}/retry/", 201, 403),
    Endpoint("post", "/api/jobs/{running}/requeue/", 403, 403),
    Endpoint("post", "/api/jobs/{queued}/fail/", 403, 403, body={"reason": "r"}),
    Endpoint("get", "/api/jobs/stuck/", 200, 200, listing=True),
    Endpoint("get", "/api/jobs/{done}/events/", 200, 200),
    Endpoint("get", "/api/jobs/{done}/events/stream/", 200, 200),
    Endpoint("get", "/api/jobs/{running}/assets/", 200, 200),
    Endpoint("get", "/api/assets/", 200, 200, listing=True),
    Endpoint("get", "/api/assets/{asset}/", 200, 200),
    Endpoint("get", "/api/assets/{asset}/download/", 200, 200),
]


@pytest.fixture
def objects(user, settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.MEDIA_ROOT = tmp_path
    # Its worker vanished an hour ago: processing, and listed as stuck.
    run = services.start(make_job(user), "gone", lease_seconds=60, now=timezone.now() - timedelta(hours=1))
    asset = services.add_asset(run, asset_type="out", name="o.txt", content=b"hello")
    return {"queued": make_job(user), "running": run, "done": completed(user), "asset": asset}


def call(client: APIClient, endpoint: Endpoint, objects: dict[str, Any]) -> Any:
    path = endpoint.path.format(**{k: v.pk for k, v in objects.items()})
    if endpoint.method == "get":
        return client.get(path)
    return client.post(path, endpoint.body or {}, format="json")


def owner_data(response: Any, objects: dict[str, Any]) -> bool:
    ids = {str(o.pk) for o in objects.values()}
    body = response.json()
    items = body["results"] if isinstance(body, dict) else body
    return any(item.get("id", item.get("job")) in ids for item in items)


@pytest.fixture
def viewer(django_user_model):  # type: ignore[no-untyped-def]
    """Staff with jobstate.view_job: sees every job, as in the admin."""
    user = django_user_model.objects.create_user("vera", password="pw-vera-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job", content_type__app_label="jobstate"))
    return user


@override_settings(JOBSTATE=FAST)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
@pytest.mark.parametrize("role", ["owner", "other", "staff", "viewer", "anonymous"])
def test_access_matrix(endpoint, role, objects, user, other_user, staff_user, viewer):
    # Staff status alone reads nothing of other people's: like any other user.
    who = {"owner": user, "other": other_user, "staff": staff_user, "viewer": viewer, "anonymous": None}[role]
    before = (Job.objects.count(), Asset.objects.count())
    response = call(client_for(who), endpoint, objects)
    if role == "anonymous":
        assert_error(response, 401, "not_authenticated")
        assert response["WWW-Authenticate"] == "Token"
        assert (Job.objects.count(), Asset.objects.count()) == before
    elif role in ("other", "staff"):
        if endpoint.listing:
            assert response.status_code == 200 and not owner_data(response, objects)
        elif endpoint.method == "post" and endpoint.path == "/api/jobs/":
            assert response.status_code == 201  # their own new job
        else:
            assert_error(response, 404, "not_found")
            assert (Job.objects.count(), Asset.objects.count()) == before
    else:
        expected = endpoint.owner if role == "owner" else endpoint.staff
        assert response.status_code == expected, getattr(response, "content", b"")[:300]
        if endpoint.listing:
            assert owner_data(response, objects)
        if expected == 403:
            assert_error(response, 403, "permission_denied")


class _BlankChallenge(BaseAuthentication):
    """A project's authentication class whose challenge is blank."""

    def authenticate(self, request: Any) -> None:
        return None

    def authenticate_header(self, request: Any) -> str:
        return " "


class _BearerWithoutChallenge(BaseAuthentication):
    """A project's class that takes 'Bearer <key>' and has no challenge of its own."""

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        scheme, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        token = Token.objects.filter(key=key).select_related("user").first() if scheme == "Bearer" else None
        return (token.user, token) if token else None


def test_a_blank_challenge_of_a_projects_authentication_class_is_ignored(monkeypatch, user):
    # Its " " was split for a scheme: IndexError, a 500 for any other scheme's header.
    monkeypatch.setattr(api_base, "authentication_classes", lambda: [TokenAuthentication, _BlankChallenge])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer abc")
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    assert error["message"] == "This API takes 'Authorization: Token <key>'."


def test_a_refused_scheme_is_not_named_back(monkeypatch, user):
    # "..., not Bearer." was wrong where a class without a challenge takes Bearer
    # (it refused only this key).
    classes = [TokenAuthentication, _BearerWithoutChallenge]
    monkeypatch.setattr(api_base, "authentication_classes", lambda: classes)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {Token.objects.create(user=user).key}")
    assert client.get(JOBS).status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Bearer not-a-key")
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    assert error["message"] == "This API takes 'Authorization: Token <key>'."


def test_token_header_errors_are_401(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    assert "token" in error["message"].lower()


def test_a_scheme_the_api_does_not_take_is_a_401_saying_so(user):
    # "Bearer <valid key>" was a 401 not_authenticated, "Authentication credentials
    # were not provided.", as if no header had been sent.
    key = Token.objects.create(user=user).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    for path in (JOBS, "/api/kinds/"):
        response = client.get(path)
        error = assert_error(response, 401, "authentication_failed")
        # (A project's own schemes are listed after Token: test_api_host_settings.)
        assert error["message"].startswith("This API takes 'Authorization: Token <key>'")
        assert "Bearer" not in error["message"]  # a class without a challenge may take it
        assert response["WWW-Authenticate"] == "Token"
    assert_error(client.post(JOBS, {"kind": "test.echo"}, format="json"), 401, "authentication_failed")
    assert Job.objects.count() == 0
    client.credentials(HTTP_AUTHORIZATION=key)  # the key alone: not repeated back
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    assert error["message"].startswith("This API takes 'Authorization: Token <key>'")
    assert key not in error["message"] and "not" not in error["message"]
    client.credentials(HTTP_AUTHORIZATION=f"token {key}")  # schemes are case-insensitive
    assert client.get(JOBS).status_code == 200
    client.credentials()
    assert_error(client.get(JOBS), 401, "not_authenticated")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/").status_code == 200  # open to all: nothing to refuse


def test_session_authentication_with_csrf(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(JOBS).status_code == 200
    # A session-authenticated write needs the CSRF token, like any Django form.
    assert_error(client.post(JOBS, {"kind": "test.echo"}, format="json"), 403, "permission_denied")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [("delete", "/api/jobs/{id}/"), ("put", "/api/jobs/{id}/"), ("get", "/api/jobs/{id}/cancel/")],
)
def test_unsupported_methods_are_a_405(user, method, path):
    job = make_job(user)
    response = getattr(client_for(user), method)(path.format(id=job.pk))
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"]
    assert Job.objects.filter(pk=job.pk, status="queued").exists()


@pytest.mark.parametrize(
    "path", ["/api/nothing/", "/api/jobs", "/api/jobs/x/y/z/", "/api/jobs/a%0Ab.c/events/", "/api/jobs/1.2/"]
)
def test_unknown_api_paths_are_a_json_404(user, path):
    error = assert_error(client_for(user).get(path), 404, "not_found")
    if path == "/api/jobs":
        assert "/api/jobs/" in error["message"]


@override_settings(
    REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"jobstate_enqueue": "2/minute", "jobstate": None}}
)
def test_enqueue_is_throttled_by_its_own_scope(user):
    cache.clear()
    client = client_for(user)
    for _ in range(2):
        assert client.post(JOBS, {"kind": "test.echo"}, format="json").status_code == 201
    response = client.post(JOBS, {"kind": "test.echo"}, format="json")
    assert_error(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    assert client.get(JOBS).status_code == 200  # reads are another scope
    assert Job.objects.count() == 2
    cache.clear()


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {}})
def test_no_configured_rate_means_no_throttle(user):
    cache.clear()
    client = client_for(user)
    assert all(client.post(JOBS, {"kind": "test.echo"}, format="json").status_code == 201 for _ in range(5))


def test_an_unexpected_error_is_a_json_500_and_logged(user, monkeypatch, caplog):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr("jobstate.api.views.services.request_cancel", broken)
    job = make_job(user)
    assert_error(client_for(user).post(f"{JOBS}{job.pk}/cancel/"), 500, "server_error")
    assert "Unhandled error" in caplog.text


def operational_error(cause: Exception, cls: type[DatabaseError] = OperationalError) -> Any:
    """The database error as Django raises it: its own class, the driver's as the cause."""
    try:
        raise cause
    except Exception as exc:
        try:
            raise cls(*exc.args) from exc
        except cls as wrapped:
            return wrapped


CONTENTION = [
    sqlite3.OperationalError("database is locked"),
    sqlite3.OperationalError("database table is locked: jobstate_job"),
    psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
    psycopg.errors.DeadlockDetected("deadlock detected"),
    psycopg.errors.SerializationFailure("could not serialize access due to concurrent update"),
]


@pytest.mark.parametrize("cause", CONTENTION, ids=lambda cause: type(cause).__name__ + ": " + str(cause))
def test_database_contention_is_a_503_to_retry(user, monkeypatch, caplog, cause):
    # Two writers on SQLite without IMMEDIATE (jobstate.W009), or a lock timeout, deadlock
    # or serialization failure on PostgreSQL: it was a 500 server_error, logged as a bug.
    def busy(*args: Any, **kwargs: Any) -> Any:
        raise operational_error(cause)

    monkeypatch.setattr("jobstate.api.views.services.request_cancel", busy)
    job = make_job(user)
    response = client_for(user).post(f"{JOBS}{job.pk}/cancel/")
    error = assert_error(response, 503, "database_busy")
    assert error == {
        "code": "database_busy",
        "message": "The database is busy with other writes; try again after Retry-After seconds.",
        "fields": {},
    }
    assert response["Retry-After"] == "1"
    assert Job.objects.get(pk=job.pk).status == job.status
    assert "Unhandled error" not in caplog.text and "Database busy" in caplog.text


@pytest.mark.parametrize(
    "exc",
    [
        operational_error(sqlite3.OperationalError("disk I/O error")),
        operational_error(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")),
        operational_error(sqlite3.OperationalError("no such table: jobstate_job")),
        operational_error(sqlite3.InterfaceError("bad parameter or other API misuse"), InterfaceError),
        operational_error(
            psycopg.errors.UndefinedTable('relation "jobstate_job" does not exist'), ProgrammingError
        ),
        ProgrammingError("the query has 1 placeholder but 2 parameters were passed"),
        IntegrityError("database is locked"),
        IntegrityError("connection refused"),
        # Refused for its settings (no SQLSTATE at connect time): retrying cannot help.
        operational_error(psycopg.OperationalError('connection failed: FATAL:  database "x" does not exist')),
        operational_error(
            psycopg.OperationalError('connection failed: FATAL:  password authentication failed for user "x"')
        ),
        operational_error(psycopg.InterfaceError("the cursor is closed"), InterfaceError),
    ],
    ids=str,
)
def test_other_database_errors_are_still_a_500(user, monkeypatch, caplog, exc):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr("jobstate.api.views.services.request_cancel", broken)
    job = make_job(user)
    assert_error(client_for(user).post(f"{JOBS}{job.pk}/cancel/"), 500, "server_error")
    assert "Unhandled error" in caplog.text


def test_the_api_root_links_the_endpoints_schema_and_docs():
    links = client_for(None).get("/api/").json()
    assert links == {
        "jobs": "http://testserver/api/jobs/",
        "kinds": "http://testserver/api/kinds/",
        "stuck": "http://testserver/api/jobs/stuck/",
        "assets": "http://testserver/api/assets/",
        "webhooks": "http://testserver/api/webhooks/",  # it was left out
        "schema": "http://testserver/api/schema/",
        "docs": "http://testserver/api/docs/",
    }


@override_settings(JOBSTATE=FAST)
def test_others_learn_nothing_of_a_job_by_filters_head_or_action_permissions_alone(
    objects, user, other_user, staff_user
):
    # Another user, and staff holding every action permission but not view_job: the
    # owner's job answers as a job that does not exist would, and no filter naming it
    # (its parent, the job it retries, its key) lists it or its relatives.
    done, parent = objects["done"], make_job(user, key="alices-key")
    child, retry = make_job(user, parent=parent), services.retry(done, None)
    operator = grant(staff_user, "cancel_job", "retry_job", "requeue_job", "view_asset")
    theirs = {str(job.pk) for job in (done, parent, child, retry)}
    missing = "00000000-0000-4000-8000-000000000000"
    for who in (other_user, operator):
        client = client_for(who)
        make_job(who, key="alices-key")  # a key is the caller's own: not alice's job
        for suffix in ("", "?wait=1", "events/", "events/stream/", "assets/"):
            for method in ("get", "head"):
                seen = getattr(client, method)(f"{JOBS}{parent.pk}/{suffix}")
                absent = getattr(client, method)(f"{JOBS}{missing}/{suffix}")
                assert seen.status_code == absent.status_code == 404, (who, method, suffix)
                assert seen.content == absent.content
        for query in (f"parent={parent.pk}", f"retry_of={done.pk}", "key=alices-key", "kind=test.echo"):
            listed = {job["id"] for job in client.get(f"{JOBS}?{query}").json()["results"]}
            assert not listed & theirs, (who, query)
        asset = objects["asset"].pk
        assert client.head(f"/api/assets/{asset}/download/").status_code == 404
