"""REST API: paused kinds. ``GET /api/kinds/`` says whether a kind is paused (why and by
whom only to staff who see every job); staff holding ``jobstate.change_job`` pause and
resume kinds through the services; refusals write nothing."""

from __future__ import annotations

import pytest

from jobstate import registry, services
from jobstate.exceptions import KindPaused
from jobstate.models import Job, KindPause
from tests.api_support import assert_error, client_for, grant, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

KINDS = "/api/kinds/"


def pause_url(kind: str, action: str = "pause") -> str:
    return f"{KINDS}{kind}/{action}/"


@pytest.fixture
def operator(staff_user):  # type: ignore[no-untyped-def]
    return grant(staff_user, "view_job", "change_job")


def _kinds(user) -> dict[str, dict]:  # type: ignore[no-untyped-def,type-arg]
    response = client_for(user).get(KINDS)
    assert response.status_code == 200
    return {k["kind"]: k for k in response.json()}


def _pauses() -> list[tuple[str, bool, str]]:
    return [(p.kind, p.active, p.reason) for p in KindPause.objects.order_by("pk")]


def test_kinds_say_whether_paused_and_since_when_but_why_only_to_staff(user, operator):
    services.pause_kind("test.echo", "ops", "the mail API is down (INC-1)")
    pause = KindPause.objects.get()
    mine = _kinds(user)
    assert mine["test.echo"]["paused"] is True
    assert mine["test.echo"]["paused_since"].endswith("Z")
    assert mine["test.echo"]["paused_since"][:19] == pause.paused_at.strftime("%Y-%m-%dT%H:%M:%S")
    assert "pause_reason" not in mine["test.echo"] and "paused_by" not in mine["test.echo"]
    assert (mine["test.schema"]["paused"], mine["test.schema"]["paused_since"]) == (False, None)
    seen = _kinds(operator)
    assert seen["test.echo"]["pause_reason"] == "the mail API is down (INC-1)"
    assert seen["test.echo"]["paused_by"] == "ops"
    assert (seen["test.schema"]["pause_reason"], seen["test.schema"]["paused_by"]) == (None, None)
    services.resume_kind("test.echo", "ops")
    assert _kinds(user)["test.echo"]["paused"] is False


def test_staff_with_change_job_pause_and_resume_a_kind(operator):
    client = client_for(operator)
    paused = client.post(pause_url("test.echo"), {"reason": "mail API down"}, format="json")
    assert paused.status_code == 200, paused.content
    body = paused.json()
    assert body["kind"] == "test.echo" and body["paused"] is True and body["reason"] == "mail API down"
    assert body["paused_by"] == "api (carol)" and body["resumed_at"] is None and body["resumed_by"] is None
    assert _pauses() == [("test.echo", True, "mail API down")]
    with pytest.raises(KindPaused):
        services.pauses.check_not_paused("test.echo")
    resumed = client.post(pause_url("test.echo", "resume"), {"reason": "back"}, format="json")
    assert resumed.status_code == 200, resumed.content
    body = resumed.json()
    assert body["paused"] is False and body["resumed_by"] == "api (carol)" and body["resume_reason"] == "back"
    assert body["resumed_at"].endswith("Z")
    # A resume's reason is optional, and so is its body.
    client.post(pause_url("test.echo"), {"reason": "again"}, format="json")
    assert client.post(pause_url("test.echo", "resume")).status_code == 200
    assert KindPause.objects.active().count() == 0


def test_a_second_pause_or_a_resume_of_a_kind_not_paused_is_refused_and_writes_nothing(operator):
    client = client_for(operator)
    refused = client.post(pause_url("test.echo", "resume"), {}, format="json")
    error = assert_error(refused, 409, "pause_refused")
    assert error["message"] == "'test.echo' is not paused."
    services.pause_kind("test.echo", "ops", "mail API down")
    error = assert_error(
        client.post(pause_url("test.echo"), {"reason": "twice"}, format="json"), 409, "pause_refused"
    )
    assert error["message"].startswith("'test.echo' is already paused (by ops since ")
    assert error["message"].endswith(": mail API down).")
    assert _pauses() == [("test.echo", True, "mail API down")]


def test_a_kind_with_jobs_stored_but_no_handler_here_may_be_paused(operator, user, temp_handler):
    temp_handler("test.elsewhere")
    make_job(user, kind="test.elsewhere")
    registry.unregister("test.elsewhere")
    response = client_for(operator).post(pause_url("test.elsewhere"), {"reason": "x"}, format="json")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("action", ["pause", "resume"])
@pytest.mark.parametrize("name", ["no.such.kind", "a/b", "x%00y"])
def test_a_name_that_is_no_kind_is_a_404(operator, action, name):
    response = client_for(operator).post(pause_url(name, action), {"reason": "x"}, format="json")
    assert_error(response, 404, "not_found")
    assert KindPause.objects.count() == 0


def test_a_paused_kind_whose_handler_and_jobs_went_may_still_be_resumed(operator, temp_handler):
    temp_handler("test.gone")
    services.pause_kind("test.gone", "ops", "x")
    registry.unregister("test.gone")
    response = client_for(operator).post(pause_url("test.gone", "resume"), {}, format="json")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "reason"),
        ({"reason": "  "}, "reason"),
        ({"reason": 5}, "reason"),
        ({"reason": "x" * 1001}, "reason"),
        ({"reason": "ok", "reasn": "typo"}, "reasn"),
        ({"reason": "ok", "kind": "test.schema"}, "kind"),
    ],
)
def test_a_bad_pause_body_is_a_400_and_writes_nothing(operator, body, field):
    response = client_for(operator).post(pause_url("test.echo"), body, format="json")
    error = assert_error(response, 400, "invalid")
    assert field in error["fields"]
    assert KindPause.objects.count() == 0


def test_an_unknown_field_in_a_resume_is_a_400_and_resumes_nothing(operator):
    services.pause_kind("test.echo", "ops", "x")
    response = client_for(operator).post(pause_url("test.echo", "resume"), {"why": "back"}, format="json")
    assert assert_error(response, 400, "invalid")["fields"] == {"why": ["Unknown field."]}
    assert KindPause.objects.active().count() == 1


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_only_active_staff_with_change_job_may_pause_or_resume_whatever_the_name(
    action, user, staff_user, django_user_model
):
    viewer = grant(staff_user, "view_job")  # sees every job, may not change them
    not_staff = grant(user, "view_job", "change_job")  # the admin is closed to them
    superuser_not_staff = django_user_model.objects.create_user("dave", is_superuser=True)
    for who in (viewer, not_staff, superuser_not_staff):
        for name in ("test.echo", "no.such.kind"):  # no 404: nothing tells which kinds exist
            response = client_for(who).post(pause_url(name, action), {"reason": "x"}, format="json")
            assert_error(response, 403, "permission_denied")
    anonymous = client_for(None).post(pause_url("test.echo", action), {"reason": "x"}, format="json")
    assert anonymous.status_code == 401
    assert KindPause.objects.count() == 0


def test_a_pause_reveals_no_ones_jobs(operator, user):
    make_job(user)
    body = client_for(operator).post(pause_url("test.echo"), {"reason": "x"}, format="json").json()
    assert set(body) == {
        "kind",
        "paused",
        "paused_at",
        "paused_by",
        "reason",
        "resumed_at",
        "resumed_by",
        "resume_reason",
    }
    assert Job.objects.filter(kind="test.echo", status="queued").count() == 1


def test_the_schema_documents_the_pause_actions(user):
    schema = client_for(None).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    pause = schema["paths"]["/api/kinds/{name}/pause/"]["post"]
    assert {"200", "403", "404", "409"} <= set(pause["responses"])
    assert "pause_refused" in pause["responses"]["409"]["description"]
    assert "/api/kinds/{name}/resume/" in schema["paths"]
    kind = schema["components"]["schemas"]["Kind"]
    assert {"paused", "paused_since"} <= set(kind["required"])
    assert not {"pause_reason", "paused_by"} & set(kind["required"])


def test_a_kind_name_longer_than_its_columns_is_refused_when_registered(temp_handler):
    # Registered, it was a 500 on PostgreSQL when paused (value too long for the column),
    # and no job of it could be stored either.
    from jobstate.models import JobStepSpawn

    columns = {m._meta.get_field("kind").max_length for m in (Job, KindPause, JobStepSpawn)}
    assert columns == {registry.KIND_MAX_LENGTH}
    temp_handler("k" * registry.KIND_MAX_LENGTH, lambda ctx: None)
    with pytest.raises(ValueError, match="at most 200 characters"):
        temp_handler("k" * (registry.KIND_MAX_LENGTH + 1), lambda ctx: None)
    assert "k" * (registry.KIND_MAX_LENGTH + 1) not in registry.all_handlers()
