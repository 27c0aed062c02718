"""Helpers shared by the API tests (tests/test_api_*.py).

Jobs are driven with jobstate.services directly, never through a worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobstate import services
from jobstate.models import Job

JOBS = "/api/jobs/"


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    """Throttle histories and open-stream counts live in the cache, and user ids
    repeat between tests on SQLite: start and end each test with none."""
    cache.clear()
    yield
    cache.clear()


def grant(user: Any, *codenames: str) -> Any:
    """Give ``user`` jobstate model permissions; returns the user reloaded (no
    stale permission cache)."""
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="jobstate")
        )
    return type(user).objects.get(pk=user.pk)


def client_for(user: Any | None) -> APIClient:
    """A client authenticated by token (or anonymous for None)."""
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def job_url(job: Job | Any, suffix: str = "") -> str:
    pk = job.pk if isinstance(job, Job) else job
    return f"{JOBS}{pk}/{suffix}"


def make_job(owner: Any, kind: str = "test.echo", parameters: dict[str, Any] | None = None, **kw: Any) -> Job:
    return services.enqueue(kind, parameters or {"n": 1}, owner=owner, **kw)


def running(owner: Any, **kw: Any) -> Job:
    """A processing job; its lease token is on ``job.lease_token``."""
    job = make_job(owner, **kw)
    return services.start(job, "test-worker")


def completed(owner: Any, result: Any = None, **kw: Any) -> Job:
    job = running(owner, **kw)
    services.complete(job, job.lease_token, result if result is not None else {"ok": True})
    return Job.objects.get(pk=job.pk)


def failed(owner: Any, error: str = "boom", **kw: Any) -> Job:
    job = running(owner, **kw)
    services.fail(
        job, job.lease_token, error, error_type="RuntimeError", traceback="Traceback: secret", retry=False
    )
    return Job.objects.get(pk=job.pk)


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is the one JSON error shape with this status (and code)."""
    assert response.status_code == status, (response.status_code, getattr(response, "content", b"")[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"code", "message", "fields"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fields"], dict)
    if code is not None:
        assert error["code"] == code, error
    return error
