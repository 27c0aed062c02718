"""The API mounted without its JSON 404, as the add-to-project guide says:
``include(api_patterns)`` under a prefix of the project's choosing."""

from __future__ import annotations

from typing import Any

from django.urls import include, path

from jobstate.api.checks import api_mounted
from jobstate.api.urls import api_patterns
from tests.api_support import client_for

urlpatterns: list[Any] = [path("jobs-api/", include(api_patterns))]


def test_api_patterns_included_as_they_are_serve_the_whole_api(user, settings):
    # It was a list without the API's app name: the API root answered {}, a POST
    # that enqueued a job answered 500 (NoReverseMatch: 'jobstate-api' is not a
    # registered namespace) and Swagger UI was a 500.
    settings.ROOT_URLCONF = __name__
    assert api_mounted()  # so jobstate.E008 looks at its apps too
    client = client_for(user)
    assert client.get("/jobs-api/").json()["jobs"] == "http://testserver/jobs-api/jobs/"
    response = client.post("/jobs-api/jobs/", {"kind": "test.echo", "parameters": {"a": 1}}, format="json")
    assert response.status_code == 201, response.content[:500]
    assert response["Location"] == f"http://testserver/jobs-api/jobs/{response.json()['id']}/"
    assert client.get("/jobs-api/docs/").status_code == 200
    assert client.get("/jobs-api/schema/").status_code == 200
    # Unknown paths are left to the project (here: Django's own 404, not the API's JSON one).
    missing = client.get("/jobs-api/nowhere/")
    assert missing.status_code == 404 and missing["Content-Type"] != "application/json"
