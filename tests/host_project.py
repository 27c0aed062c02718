"""A new project whose ``REST_FRAMEWORK`` comes from the environment
(``JOBSTATE_HOST_REST_FRAMEWORK``, JSON) and that mounts only the jobstate API.

As settings (``DJANGO_SETTINGS_MODULE=tests.host_project``) it is the test
project with that REST_FRAMEWORK; run as ``python -m tests.host_project`` it
migrates its own database, calls the API as a client would and prints one JSON
line of results (tests/test_api_host_settings.py checks them).
"""

import json
import os

from project.test_settings import *  # noqa: F403

REST_FRAMEWORK = json.loads(os.environ.get("JOBSTATE_HOST_REST_FRAMEWORK") or "{}")
ROOT_URLCONF = "tests.host_urls"


def main() -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from rest_framework.authtoken.models import Token
    from rest_framework.settings import api_settings

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user("dora", password="pw-dora-123")
    auth = {"HTTP_AUTHORIZATION": f"Token {Token.objects.create(user=user).key}"}
    client = Client()
    body = json.dumps({"kind": "test.echo", "parameters": {"a": 1}})
    kinds = client.get("/api/kinds/", **auth).json()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    defaults = REST_FRAMEWORK.get("DEFAULT_AUTHENTICATION_CLASSES", "drf")
    if defaults == "drf":  # DRF's own defaults: session and basic
        assert [c.__name__ for c in api_settings.DEFAULT_AUTHENTICATION_CLASSES] == [
            "SessionAuthentication",
            "BasicAuthentication",
        ]
    results = {
        "defaults": defaults,
        "token list": client.get("/api/jobs/", **auth).status_code,
        "token enqueue": client.post("/api/jobs/", body, content_type="application/json", **auth).status_code,
        "kinds": "test.echo" in {k["kind"] for k in kinds} and "wf.child" not in {k["kind"] for k in kinds},
        "internal kind": client.post(
            "/api/jobs/", json.dumps({"kind": "wf.child"}), content_type="application/json", **auth
        ).status_code,
        "anonymous": client.get("/api/jobs/").status_code,
        "schema": schema.status_code,
        "schema paths": schema.status_code == 200 and "/api/kinds/" in json.loads(schema.content)["paths"],
        "docs": client.get("/api/docs/").status_code,
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
