"""REST API: the OpenAPI schema, the docs page, and a schemathesis run against
the live schema through the WSGI app (bounded examples; zero 5xx; responses
conform to the schema). The token user owns jobs in every state and assets, so
generated requests mostly reach real objects; explicit requests check each
success response (201, 200, 202, 302, streams, downloads) against the schema."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode, checks
from schemathesis.core.failures import FailureGroup

import jobstate
from jobstate import services
from jobstate.api.outputs import JobDetailSerializer
from jobstate.models import JobStep
from jobstate.models.step import StepStatus
from tests.api_support import client_for, completed, failed, make_job, running

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

# Bounded for CI (deterministic); raise it locally to hunt: JOBSTATE_SCHEMATHESIS_EXAMPLES=500.
EXAMPLES = int(os.environ.get("JOBSTATE_SCHEMATHESIS_EXAMPLES", "25"))


def test_schema_is_served_and_lists_every_endpoint(user):
    response = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in [
        "/api/jobs/",
        "/api/jobs/{id}/",
        "/api/jobs/{id}/cancel/",
        "/api/jobs/{id}/retry/",
        "/api/jobs/{id}/events/",
        "/api/jobs/{id}/events/stream/",
        "/api/jobs/{id}/assets/",
        "/api/assets/{id}/",
        "/api/assets/{id}/download/",
    ]:
        assert path in paths, path
    create = paths["/api/jobs/"]["post"]["responses"]
    assert {"200", "201", "400", "401", "409", "413"} <= set(create)
    assert create["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    cancel = paths["/api/jobs/{id}/cancel/"]["post"]["responses"]
    assert {"200", "202", "404", "409"} <= set(cancel)
    assert "text/event-stream" in paths["/api/jobs/{id}/events/stream/"]["get"]["responses"]["200"]["content"]


def test_every_request_body_refuses_properties_it_does_not_list(user):
    # The API refuses a body field it does not take (a 400): the schema says so, and
    # generated examples no longer send typos a positive case expects to be accepted.
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    bodies = {
        f"{method.upper()} {path}": op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    }
    assert {"POST /api/jobs/", "POST /api/jobs/{id}/fail/", "PATCH /api/webhooks/{id}/"} <= set(bodies)
    for operation, ref in bodies.items():
        assert components[ref.rsplit("/", 1)[1]].get("additionalProperties") is False, operation
    # A field of free-form JSON stays open.
    assert components["Enqueue"]["properties"]["parameters"]["additionalProperties"] is True


def test_a_pause_reason_the_api_requires_is_not_blank_in_the_schema(user):
    # A blank reason is a 400; the schema let generated clients send one.
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    reason = schema["components"]["schemas"]["PauseKind"]["properties"]["reason"]
    assert reason["minLength"] == 1


def test_retry_takes_a_workflows_first_step_to_run_again(user):
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    body = schema["paths"]["/api/jobs/{id}/retry/"]["post"]["requestBody"]["content"]["application/json"]
    component = schema["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    assert set(component["properties"]) == {"reason", "from_step"}
    from_step = component["properties"]["from_step"]
    assert from_step["type"] == "string" and from_step["nullable"] is True
    assert "jobstate_workflow retry --from STEP" in from_step["description"]


def test_the_schema_names_what_errors_and_creates_carry(user):
    # A second retry's 409 names the retry (retry_id), each 201 its new object
    # (Location), each 429 and 503 when to try again (Retry-After): none was in it.
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    detail = schema["components"]["schemas"]["ErrorDetail"]["properties"]
    assert detail["retry_id"]["format"] == "uuid" and "already_retried" in detail["retry_id"]["description"]
    conflict = schema["paths"]["/api/jobs/{id}/retry/"]["post"]["responses"]["409"]["description"]
    assert "`already_retried`, with `error.retry_id`" in conflict
    creates = {
        f"{method.upper()} {path}"
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if op["responses"].get("201", {}).get("headers", {}).get("Location", {}).get("required")
    }
    assert creates == {"POST /api/jobs/", "POST /api/jobs/{id}/retry/", "POST /api/webhooks/"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for code in ("429", "503"):
                assert "Retry-After" in op["responses"][code]["headers"], (method, path, code)


def test_the_enqueue_schema_names_a_replays_headers_and_a_reused_keys_422(user):
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    responses = schema["paths"]["/api/jobs/"]["post"]["responses"]
    headers = responses["200"]["headers"]
    assert headers["Location"]["required"] and headers["Location"]["schema"]["format"] == "uri"
    assert headers["Idempotent-Replayed"]["schema"] == {"type": "string", "enum": ["true"]}
    assert "`idempotency_key_reused`" in responses["422"]["description"]
    assert responses["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    detail = schema["components"]["schemas"]["ErrorDetail"]["properties"]
    assert (
        detail["job_id"]["format"] == "uuid" and "idempotency_key_reused" in detail["job_id"]["description"]
    )


def test_the_progress_stream_names_the_last_event_id_header(user):
    # The stream resumes from Last-Event-ID (and answers 204 to a finished job's final id);
    # the schema listed no such header, so a generated client could not send it.
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/jobs/{id}/events/stream/"]["get"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert set(headers) == {"Last-Event-ID"}
    assert headers["Last-Event-ID"]["schema"] == {"type": "string"}
    assert not headers["Last-Event-ID"].get("required")


def test_components_describe_themselves_to_clients(user):
    # A serializer's docstring is its component's description, inherited from the nearest
    # base with one: every request body's was StrictInput's, a maintainer's note
    # ("The base of every request body's serializer (before ``OutputSerializer``...").
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    for name, component in components.items():
        text = component.get("description", "")
        assert "``" not in text and "serializer" not in text.lower(), (name, text)
        for field, spec in component.get("properties", {}).items():
            assert "``" not in spec.get("description", ""), (name, field)
    assert components["Enqueue"]["description"].startswith("A job to queue")
    assert components["Reason"]["description"] != components["RequiredReason"]["description"]


def test_started_at_and_duration_say_they_are_the_last_runs(user):
    # A job run again (another attempt, a resumed workflow) keeps its latest run's start only;
    # started_at had no description and duration said "Seconds since it started".
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    for name in ("Job", "JobDetail"):
        assert "last run started" in components[name]["properties"]["started_at"]["description"], name
    assert "last run started" in components["JobDetail"]["properties"]["duration"]["description"]


def test_docs_are_served_from_the_installed_packages_without_a_cdn(user):
    response = client_for(None).get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html and "/api/schema/" in html
    assert not re.search(r"(src|href)=\"https?://", html), "no external assets"
    assert "drf_spectacular_sidecar" in html


@pytest.mark.parametrize("accept", ["text/html", "*/*"])
def test_options_on_the_docs_page_lists_its_methods(accept):
    # DRF's OPTIONS answer is metadata, which the page's HTML renderer had no template
    # for: a 500 (a browser's or a scanner's OPTIONS).
    client = client_for(None)
    client.raise_request_exception = False
    response = client.options("/api/docs/", HTTP_ACCEPT=accept)
    assert response.status_code == 200, response.content[:300]
    assert {m.strip() for m in response["Allow"].split(",")} >= {"GET", "HEAD", "OPTIONS"}
    assert response.content == b""


class InTransactionApp:
    """Django's WSGI handler for use inside a test transaction: like the test
    client, it keeps Django from closing the connection at request start/end."""

    def __init__(self) -> None:
        self.handler = WSGIHandler()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            result = self.handler(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                result.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)


# Loaded once at collection (no database needed to build the schema).
LIVE = schemathesis.openapi.from_wsgi("/api/schema/", InTransactionApp())
OPERATIONS = sorted((op.ok().path, op.ok().method.upper()) for op in LIVE.get_all_operations())
# Negative examples need something to break: a parameter or a body.
CASES = [
    (path, method, mode)
    for path, method in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE
    or {"parameters", "requestBody"} & set(LIVE[path][method].definition.raw)
]


# Short streams and long-polls; the throttles and the stream cap have their own tests.
FAST = {"SSE_MAX_SECONDS": 0.1, "SSE_POLL_SECONDS": 0.02, "LONGPOLL_MAX_SECONDS": 0.1}
NO_LIMITS = {"DEFAULT_THROTTLE_RATES": {"jobstate_stream": None}}
# Everything a success or error response must satisfy (no generated input involved).
CONFORMANCE = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture
def token(user) -> str:  # type: ignore[no-untyped-def]
    return Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def seeded(user, settings, tmp_path) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """The token user's jobs in every state, and assets (a stored file, an external
    URL), so that generated requests reach real objects and succeed."""
    settings.MEDIA_ROOT = tmp_path
    cancelling = running(user)
    services.request_cancel(cancelling, services.Actor.api(user), "stop")
    cancelled = make_job(user)
    services.request_cancel(cancelled, services.Actor.api(user), "not needed")
    done = completed(user, result={"rows": 3})
    JobStep.objects.create(
        job=done,
        position=1,
        name="load",
        status="completed",
        cursor={"page": 2},
        started_at=done.started_at,
        finished_at=done.finished_at,
    )
    files = [
        services.add_asset(done, asset_type="report", name="out.csv", content=b"a,b\n1,2\n"),
        services.add_asset(done, asset_type="link", url="https://example.org/data.json"),
    ]
    dead = failed(user)
    JobStep.objects.create(job=dead, position=0, name="load", status="running", started_at=dead.started_at)
    jobs = [make_job(user), running(user), cancelling, cancelled, done, dead]
    return {"jobs": [str(j.pk) for j in jobs], "assets": [str(a.pk) for a in files]}


def _with_seeded_objects(strategy: Any, path: str, method: str, seeded: dict[str, list[str]]) -> Any:
    """Mostly real ids (and a registered kind to enqueue), sometimes the generated ones."""
    ids = seeded["assets"] if path.startswith("/api/assets/") else seeded["jobs"]

    def use(case: Any, pk: str | None, kind: str | None) -> Any:
        if pk is not None and "id" in (case.path_parameters or {}):
            case.path_parameters["id"] = pk
        if kind is not None and (path, method) == ("/api/jobs/", "POST") and isinstance(case.body, dict):
            case.body["kind"] = kind
        return case

    real_ids = st.sampled_from([*ids, None])
    kinds = st.sampled_from(["test.echo", "test.echo", "test.echo", None])
    return st.builds(use, strategy, real_ids, kinds)


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{m} {p} {g.value}" for p, m, g in CASES])
@override_settings(JOBSTATE=FAST, REST_FRAMEWORK={**django_settings.REST_FRAMEWORK, **NO_LIMITS})
def test_api_conforms_to_its_schema(path, method, mode, token, seeded):
    operation = LIVE[path][method]
    headers = {"Authorization": f"Token {token}"}
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE:  # a negative case must stay invalid
        strategy = _with_seeded_objects(strategy, path, method, seeded)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=EXAMPLES <= 25,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        case.call_and_validate(
            headers=headers,
            # Valid-looking input still meets unknown kinds, random ids and refused
            # transitions (400/404/409), and a valid token is always sent, so "accepts
            # invalid auth" cannot apply; anonymous access is covered by test_api_access.
            excluded_checks=[checks.positive_data_acceptance, checks.max_response_time, checks.ignored_auth],
        )

    run()


# --- real success responses, validated against the schema ---------------------------


def call(token: str, path: str, method: str, expect: int, **parts: Any) -> Any:
    """One request through the live schema's operation; its response must conform."""
    case = LIVE[path][method].Case(media_type="application/json" if "body" in parts else None, **parts)
    response = case.call(headers={"Authorization": f"Token {token}"})
    assert response.status_code == expect, (path, response.status_code, response.text[:500])
    case.validate_response(response, checks=CONFORMANCE)
    return response


@override_settings(
    JOBSTATE={**FAST, "API_MAX_PRIORITY": 3}, REST_FRAMEWORK={**django_settings.REST_FRAMEWORK, **NO_LIMITS}
)
def test_success_responses_conform_to_the_schema(user, token, seeded):
    queued, processing, cancelling, _cancelled, done, dead = seeded["jobs"]
    stored, external = seeded["assets"]
    body = {"kind": "test.echo", "parameters": {"n": 1}, "key": "nightly", "priority": 3}
    created = call(token, "/api/jobs/", "POST", 201, body=body).json()
    assert created["status"] == "queued" and created["allowed_actions"] == ["cancel"]
    again = call(token, "/api/jobs/", "POST", 200, body=body)
    assert again.json()["id"] == created["id"] and again.headers["idempotent-replayed"] == ["true"]
    reused = call(token, "/api/jobs/", "POST", 422, body={**body, "parameters": {"n": 2}}).json()
    assert reused["error"]["job_id"] == created["id"]
    page = call(token, "/api/jobs/", "GET", 200, query={"status": ["queued", "failed"], "page_size": 2})
    assert len(page.json()["results"]) == 2 and page.json()["next"]
    following = parse_qs(urlsplit(page.json()["next"]).query)
    assert call(token, "/api/jobs/", "GET", 200, query=following).json()["results"]
    detail = call(token, "/api/jobs/{id}/", "GET", 200, path_parameters={"id": done}).json()
    assert detail["result"] == {"rows": 3} and detail["steps"][0]["name"] == "load"
    # A step left running in a failed job is shown as state(job) shows it (in the schema's enum).
    (step,) = call(token, "/api/jobs/{id}/", "GET", 200, path_parameters={"id": dead}).json()["steps"]
    assert (step["status"], step["stored_status"]) == ("interrupted", "running")
    call(token, "/api/jobs/{id}/", "GET", 200, path_parameters={"id": processing}, query={"wait": 0.05})
    events = call(token, "/api/jobs/{id}/events/", "GET", 200, path_parameters={"id": done}).json()
    assert [e["to_status"] for e in events["results"]] == ["queued", "processing", "completed"]
    call(token, "/api/jobs/{id}/events/", "GET", 200, path_parameters={"id": cancelling})
    stream = call(token, "/api/jobs/{id}/events/stream/", "GET", 200, path_parameters={"id": done})
    assert "event: end" in stream.text
    cancel = "/api/jobs/{id}/cancel/"
    assert (
        call(token, cancel, "POST", 200, path_parameters={"id": queued}, body={}).json()["status"]
        == "cancelled"
    )
    reason = {"reason": "enough"}
    assert call(token, cancel, "POST", 202, path_parameters={"id": processing}, body=reason).json()[
        "cancel_requested"
    ]
    retried = call(
        token, "/api/jobs/{id}/retry/", "POST", 201, path_parameters={"id": dead}, body=reason
    ).json()
    assert retried["retry_of"] == dead
    again = call(token, "/api/jobs/{id}/retry/", "POST", 409, path_parameters={"id": dead}, body=reason)
    assert again.json()["error"]["retry_id"] == retried["id"]
    assets = call(token, "/api/jobs/{id}/assets/", "GET", 200, path_parameters={"id": done}).json()
    assert {a["id"] for a in assets["results"]} == {stored, external}
    call(token, "/api/assets/", "GET", 200)
    asset = call(token, "/api/assets/{id}/", "GET", 200, path_parameters={"id": stored}).json()
    assert asset["size"] == 8 and asset["download_url"].endswith(f"/api/assets/{stored}/download/")
    download = call(token, "/api/assets/{id}/download/", "GET", 200, path_parameters={"id": stored})
    assert download.content == b"a,b\n1,2\n"
    part = call(
        token,
        "/api/assets/{id}/download/",
        "GET",
        206,
        path_parameters={"id": stored},
        headers={"Range": "bytes=-4"},
    )
    assert part.content == b"1,2\n" and part.headers["content-range"] == ["bytes 4-7/8"]
    call(
        token,
        "/api/assets/{id}/download/",
        "GET",
        416,
        path_parameters={"id": stored},
        headers={"Range": "bytes=8-"},
    )
    call(token, "/api/assets/{id}/download/", "GET", 302, path_parameters={"id": external})
    call(token, "/api/jobs/stuck/", "GET", 200)
    # And the refusals an ordinary caller meets, in the same schema.
    call(token, cancel, "POST", 409, path_parameters={"id": done}, body={})
    call(token, "/api/jobs/{id}/requeue/", "POST", 403, path_parameters={"id": processing}, body={})


def test_operator_remedies_conform_to_the_schema(user, staff_user, seeded):
    operator = type(staff_user).objects.get(pk=staff_user.pk)
    operator.user_permissions.add(Permission.objects.get(codename="requeue_job"))
    operator.user_permissions.add(Permission.objects.get(codename="view_job"))
    token = Token.objects.get_or_create(user=operator)[0].key
    _queued, processing, _cancelling, cancelled, _done, _dead = seeded["jobs"]
    requeued = call(
        token, "/api/jobs/{id}/requeue/", "POST", 200, path_parameters={"id": processing}, body={}
    )
    assert requeued.json()["status"] == "queued"
    body = {"reason": "bad input"}
    failed_now = call(
        token, "/api/jobs/{id}/fail/", "POST", 200, path_parameters={"id": processing}, body=body
    )
    assert failed_now.json()["error_type"] == "OperatorFailed"
    call(token, "/api/jobs/{id}/fail/", "POST", 409, path_parameters={"id": cancelled}, body=body)


def test_kind_pauses_conform_to_the_schema(user, token, staff_user):
    operator = type(staff_user).objects.get(pk=staff_user.pk)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "change_job"]))
    staff = Token.objects.get_or_create(user=operator)[0].key
    kind = {"name": "test.echo"}
    down = {"reason": "down"}
    paused = call(staff, "/api/kinds/{name}/pause/", "POST", 200, path_parameters=kind, body=down)
    assert paused.json()["paused"] is True
    call(staff, "/api/kinds/{name}/pause/", "POST", 409, path_parameters=kind, body={"reason": "again"})
    shown = {k["kind"]: k for k in call(staff, "/api/kinds/", "GET", 200).json()}
    assert shown["test.echo"]["pause_reason"] == "down"
    mine = {k["kind"]: k for k in call(token, "/api/kinds/", "GET", 200).json()}
    assert mine["test.echo"]["paused"] is True and "pause_reason" not in mine["test.echo"]
    call(token, "/api/kinds/{name}/resume/", "POST", 403, path_parameters=kind, body={})
    resumed = call(staff, "/api/kinds/{name}/resume/", "POST", 200, path_parameters=kind, body={})
    assert resumed.json()["resumed_by"] == "api (carol)"
    call(staff, "/api/kinds/{name}/resume/", "POST", 409, path_parameters=kind, body={})
    call(staff, "/api/kinds/{name}/resume/", "POST", 404, path_parameters={"name": "no.such"}, body={})


def test_a_response_that_breaks_the_schema_is_caught(user, token, seeded, monkeypatch):
    """The validation above is not vacuous: a wrong type in a success body fails it."""
    original = JobDetailSerializer.to_representation

    def broken(self: Any, instance: Any) -> Any:
        return {**original(self, instance), "progress": "half"}

    monkeypatch.setattr(JobDetailSerializer, "to_representation", broken)
    with pytest.raises(FailureGroup):
        call(token, "/api/jobs/{id}/", "GET", 200, path_parameters={"id": seeded["jobs"][0]})


def test_in_a_project_without_spectacular_settings_the_schema_and_docs_are_jobstates(
    user, capsys, monkeypatch
):
    """A host project that configures nothing (drf-spectacular's defaults: a CDN, no
    enum names, no title): jobstate's title, version and enum names (no collision
    warning), and Swagger UI from the sidecar."""
    from drf_spectacular.settings import spectacular_settings

    monkeypatch.setattr(
        spectacular_settings, "SWAGGER_UI_DIST", "https://cdn.jsdelivr.net/npm/swagger-ui-dist@latest"
    )
    monkeypatch.setattr(
        spectacular_settings, "SWAGGER_UI_FAVICON_HREF", "https://cdn.jsdelivr.net/favicon.png"
    )
    monkeypatch.setattr(spectacular_settings, "ENUM_NAME_OVERRIDES", {})
    monkeypatch.setattr(spectacular_settings, "TITLE", "")
    monkeypatch.setattr(spectacular_settings, "VERSION", "0.0.0")
    response = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    assert (schema["info"]["title"], schema["info"]["version"]) == ("jobstate API", jobstate.__version__)
    assert {"JobStatusEnum", "StepStatusEnum"} <= set(schema["components"]["schemas"])
    steps = schema["components"]["schemas"]["StepStatusEnum"]["enum"]
    assert steps == [*StepStatus.values, "interrupted"]
    assert "Warning" not in capsys.readouterr().err
    html = client_for(None).get("/api/docs/").content.decode()
    assert not re.search(r"(src|href)=\"https?://", html), "no external assets"
    assert "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
