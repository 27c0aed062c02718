"""The API works whatever the host project's ``REST_FRAMEWORK`` says.

Every test of the API suites imported below runs again here twice: in a project
with an empty ``REST_FRAMEWORK`` and in a hostile one (other default
authentication, permissions, throttles, pagination, filters, schema class,
renderers, parsers, versioning, exception handler, date format), mounting only
``jobstate.api.urls`` (``tests/host_urls.py``). DRF binds most defaults to
``APIView`` when it is first imported, so the fixture rebinds them as a project
started with these settings would have them. ``test_a_fresh_project_*`` checks
the same in a new process that imports DRF with those settings from the start.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rest_framework.generics import GenericAPIView
from rest_framework.settings import api_settings
from rest_framework.test import APIClient
from rest_framework.views import APIView

from tests.api_support import JOBS, assert_error, client_for, make_job
from tests.test_api_access import *  # noqa: F403
from tests.test_api_actions import *  # noqa: F403
from tests.test_api_assets import *  # noqa: F403
from tests.test_api_jobs import *  # noqa: F403
from tests.test_api_policy import *  # noqa: F403
from tests.test_api_stream import *  # noqa: F403
from tests.test_api_stream_access import *  # noqa: F403

ROOT = Path(__file__).resolve().parents[1]

HOSTILE: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": "1/day"},
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 1,
    "DEFAULT_FILTER_BACKENDS": ["rest_framework.filters.OrderingFilter"],
    "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.StaticHTMLRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.NamespaceVersioning",
    "ALLOWED_VERSIONS": ["v9"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "rest_framework.negotiation.BaseContentNegotiation",
    "EXCEPTION_HANDLER": "rest_framework.views.exception_handler",
    "DATETIME_FORMAT": "%d.%m.%Y %H:%M",
    "DATETIME_INPUT_FORMATS": ["%d.%m.%Y %H:%M"],
    "STRICT_JSON": False,
}
HOSTS: dict[str, dict[str, Any]] = {"empty": {}, "hostile": HOSTILE}

# What DRF binds to its base classes at import time, from which setting.
BINDINGS = [
    (APIView, "renderer_classes", "DEFAULT_RENDERER_CLASSES"),
    (APIView, "parser_classes", "DEFAULT_PARSER_CLASSES"),
    (APIView, "authentication_classes", "DEFAULT_AUTHENTICATION_CLASSES"),
    (APIView, "throttle_classes", "DEFAULT_THROTTLE_CLASSES"),
    (APIView, "permission_classes", "DEFAULT_PERMISSION_CLASSES"),
    (APIView, "content_negotiation_class", "DEFAULT_CONTENT_NEGOTIATION_CLASS"),
    (APIView, "metadata_class", "DEFAULT_METADATA_CLASS"),
    (APIView, "versioning_class", "DEFAULT_VERSIONING_CLASS"),
    (GenericAPIView, "filter_backends", "DEFAULT_FILTER_BACKENDS"),
    (GenericAPIView, "pagination_class", "DEFAULT_PAGINATION_CLASS"),
]


@pytest.fixture(autouse=True, params=list(HOSTS))
def host_project(request, settings, monkeypatch):  # type: ignore[no-untyped-def]
    """A project whose REST_FRAMEWORK is empty or hostile (DRF reloads its
    settings on ``setting_changed``; the class attributes are rebound here)."""
    settings.REST_FRAMEWORK = HOSTS[request.param]
    settings.ROOT_URLCONF = "tests.host_urls"
    for cls, attr, setting in BINDINGS:
        monkeypatch.setattr(cls, attr, getattr(api_settings, setting))
    assert api_settings.DEFAULT_SCHEMA_CLASS.__module__ == "rest_framework.schemas.openapi"
    return request.param


def test_a_token_is_accepted_though_the_project_does_not_list_token_auth(user):
    assert "TokenAuthentication" not in str(api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    client = client_for(user)
    assert client.get(JOBS).status_code == 200
    response = client.post(JOBS, {"kind": "test.echo", "parameters": {"a": 1}}, format="json")
    assert response.status_code == 201, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["created_at"].endswith("Z")  # ISO 8601, not the project's DATETIME_FORMAT


def test_the_projects_own_authentication_still_works(user):
    # BasicAuthentication: DRF's default (empty project) and the hostile project's only one.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"alice:pw-alice-123").decode())
    assert client.get(JOBS).status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"alice:wrong").decode())
    assert_error(client.get(JOBS), 401, "authentication_failed")
    client.credentials(HTTP_AUTHORIZATION="Bearer abc")
    error = assert_error(client.get(JOBS), 401, "authentication_failed")
    takes = "This API takes 'Authorization: Token <key>' or 'Authorization: Basic ...'"
    assert error["message"] == f"{takes}."


def test_the_schema_and_docs_are_served(user):
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200, response.content[:500]
    schema = json.loads(response.content)
    assert {"/api/jobs/", "/api/kinds/", "/api/jobs/{id}/events/stream/"} <= set(schema["paths"])
    assert not any(p.startswith("/api/schema") or p.startswith("/api/docs") for p in schema["paths"])
    post = schema["paths"]["/api/jobs/"]["post"]
    assert "403" in post["responses"] and "tokenAuth" in json.dumps(post["security"])
    assert APIClient().get("/api/docs/").status_code == 200


def test_pages_filters_and_parsers_are_the_apis_own(user):
    for _ in range(3):
        make_job(user)
    make_job(user, kind="test.limited")
    client = client_for(user)
    page = client.get(JOBS, {"kind": "test.echo", "page_size": 2}).json()
    assert set(page) == {"next", "previous", "results"} and len(page["results"]) == 2
    assert len(client.get(page["next"]).json()["results"]) == 1
    response = client.post(JOBS, {"kind": "test.echo"})  # a form, not JSON
    assert_error(response, 415, "unsupported_media_type")
    assert_error(
        client.post(JOBS, b'{"kind": "test.echo", "priority": NaN}', content_type="application/json"), 400
    )


def test_errors_keep_the_one_shape(user):
    job = make_job(user)
    assert_error(client_for(None).get(JOBS), 401, "not_authenticated")
    assert_error(client_for(user).post(f"{JOBS}{job.pk}/requeue/"), 403, "permission_denied")
    assert_error(client_for(user).get(f"{JOBS}{job.pk}/", {"wait": "x"}), 400, "invalid")


@pytest.mark.slow
def test_a_fresh_project_with_these_settings_serves_the_api(host_project, tmp_path):
    """A new process that imports DRF with the host's settings from the start
    (tests/host_project.py), on its own SQLite database."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.host_project",
        "JOBSTATE_HOST_REST_FRAMEWORK": json.dumps(HOSTS[host_project]),
        "JOBSTATE_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'host.sqlite3'}",
    }
    command = [sys.executable, "-m", "tests.host_project"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results == {
        "defaults": HOSTS[host_project].get("DEFAULT_AUTHENTICATION_CLASSES", "drf"),
        "token list": 200,
        "token enqueue": 201,
        "kinds": True,
        "internal kind": 400,
        "anonymous": 401,
        "schema": 200,
        "schema paths": True,
        "docs": 200,
    }
