"""REST API: cancel, retry and the transition history."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.stuck import REASONS
from jobstate.testing import drain
from tests.api_support import assert_error, client_for, completed, failed, grant, job_url, make_job, running

pytestmark = pytest.mark.django_db


# Cancel -----------------------------------------------------------------------


def test_cancel_a_queued_job_is_immediate(user):
    job = make_job(user)
    response = client_for(user).post(job_url(job, "cancel/"), {"reason": "not needed"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled" and body["allowed_actions"] == ["retry"]
    event = JobEvent.objects.filter(job=job).last()
    assert (event.to_status, event.actor_label, event.actor_id, event.reason) == (
        "cancelled",
        "api",
        user.pk,
        "not needed",
    )


def test_cancel_a_running_job_is_a_request(user):
    job = running(user)
    client = client_for(user)
    response = client.post(job_url(job, "cancel/"), format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "processing" and body["cancel_requested"] is True
    assert body["allowed_actions"] == []  # already requested
    # The worker sees the request on its next heartbeat.
    assert services.heartbeat(job, job.lease_token).cancel_requested
    # Asking again changes nothing and says the same.
    assert client.post(job_url(job, "cancel/")).status_code == 202
    assert JobEvent.objects.filter(job=job, transition="request_cancel").count() == 1


@pytest.mark.parametrize("finish", [completed, failed])
def test_cancel_a_finished_job_is_a_409_naming_its_state(user, finish):
    job = finish(user)
    before = list(JobEvent.objects.filter(job=job).values_list("pk", flat=True))
    error = assert_error(client_for(user).post(job_url(job, "cancel/")), 409, "invalid_transition")
    assert error["current_status"] == job.status
    assert (
        error["message"]
        == f"The job is {job.status}; only a queued, waiting or running job can be cancelled."
    )
    assert list(JobEvent.objects.filter(job=job).values_list("pk", flat=True)) == before


def test_cancel_reason_must_be_text(user):
    job = make_job(user)
    assert_error(client_for(user).post(job_url(job, "cancel/"), {"reason": 5}, format="json"), 400, "invalid")
    assert Job.objects.get(pk=job.pk).status == "queued"


def test_staff_need_the_permission_to_cancel_someone_elses_job(user, staff_user):
    job = make_job(user)
    # Staff without jobstate.view_job do not even see it.
    assert_error(client_for(staff_user).post(job_url(job, "cancel/")), 404, "not_found")
    grant(staff_user, "view_job")
    client = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    assert_error(client.post(job_url(job, "cancel/")), 403, "permission_denied")
    assert Job.objects.get(pk=job.pk).status == "queued"
    grant(staff_user, "cancel_job")
    staff = type(staff_user).objects.get(pk=staff_user.pk)
    response = client_for(staff).post(job_url(job, "cancel/"))
    assert response.status_code == 200
    assert JobEvent.objects.filter(job=job).last().actor_id == staff_user.pk


def test_allowed_actions_follow_the_staff_permissions(user, staff_user, django_user_model):
    job = completed(user)
    staff_user = grant(staff_user, "view_job")
    assert client_for(staff_user).get(job_url(job)).json()["allowed_actions"] == []
    boss = django_user_model.objects.create_superuser("root", password="pw-root-123")
    assert client_for(boss).get(job_url(job)).json()["allowed_actions"] == ["retry"]
    assert client_for(boss).get(job_url(make_job(user))).json()["allowed_actions"] == ["cancel", "fail"]


# Retry ------------------------------------------------------------------------


def test_retry_creates_a_new_linked_job(user):
    old = failed(user)
    response = client_for(user).post(job_url(old, "retry/"), {"reason": "fixed the input"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != str(old.pk)
    assert body["retry_of"] == str(old.pk) and body["status"] == "queued"
    assert response["Location"].endswith(f"/api/jobs/{body['id']}/")
    new = Job.objects.get(pk=body["id"])
    assert new.owner == user and new.parameters == old.parameters
    assert Job.objects.get(pk=old.pk).status == "failed"  # history is not rewritten


@pytest.mark.parametrize("make", [make_job, running])
def test_retry_an_active_job_is_a_409(user, make):
    job = make(user)
    error = assert_error(client_for(user).post(job_url(job, "retry/")), 409, "invalid_transition")
    assert error["current_status"] == job.status
    assert Job.objects.count() == 1


def test_a_second_retry_of_a_job_is_a_409_naming_the_first(user):
    old = failed(user)
    first = services.retry(old, "ops", "fixed")
    error = assert_error(client_for(user).post(job_url(old, "retry/")), 409, "already_retried")
    assert error["retry_id"] == str(first.pk)
    assert error["message"] == f"Job {old.pk} was already retried as job {first.pk}: retry that one instead."
    assert list(Job.objects.filter(retry_of=old.pk)) == [first]


def test_a_job_already_retried_does_not_offer_retry(user):
    # allowed_actions listed "retry" for it, which the service refuses (409 already_retried).
    old, fresh = failed(user), failed(user)
    services.retry(old, "ops", "fixed")
    client = client_for(user)
    assert client.get(job_url(old)).json()["allowed_actions"] == []
    assert client.get(job_url(fresh)).json()["allowed_actions"] == ["retry"]
    listed = {row["id"]: row["allowed_actions"] for row in client.get("/api/jobs/").json()["results"]}
    assert listed[str(old.pk)] == [] and listed[str(fresh.pk)] == ["retry"]


def test_retry_while_its_key_is_active_again_is_a_409(user):
    old = completed(user, key="nightly")
    make_job(user, key="nightly", watermark=2)  # the key is dirty: a new active job holds it
    assert_error(client_for(user).post(job_url(old, "retry/")), 409, "duplicate_active_key")


def test_retry_of_a_job_whose_kind_is_gone_says_so_on_no_request_field(user, staff_user):
    # It was a field error on "kind", which the retry request has no field for. (Its
    # owner may not start the kind any more, a 403: staff with the permission get here.)
    old = failed(user)
    Job.objects.filter(pk=old.pk).update(kind="test.gone")  # its handler since removed from the code
    staff = grant(staff_user, "view_job", "retry_job")
    error = assert_error(client_for(staff).post(job_url(old, "retry/")), 400, "unknown_kind")
    assert error["fields"] == {}
    assert error["message"] == "This job's kind 'test.gone' is no longer registered: it cannot be retried."
    assert list(Job.objects.filter(retry_of=old.pk)) == []


def failed_workflow(user: Any) -> Job:
    """A wf.fixable whose step ``two`` failed: ``one`` completed."""
    job = make_job(user, kind="wf.fixable", parameters={})
    drain(kinds=["wf.fixable"])
    job.refresh_from_db()
    assert job.status == Status.FAILED
    return job


def test_retry_a_workflow_from_a_step_copies_the_steps_before_it(user, staff_user):
    old = failed_workflow(user)
    staff = grant(staff_user, "view_job", "retry_job")
    response = client_for(staff).post(job_url(old, "retry/"), {"from_step": "two"}, format="json")
    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.retry_of_id == old.pk and new.status == Status.QUEUED
    steps = dict(JobStep.objects.filter(job_id=new.pk).values_list("name", "status"))
    assert steps == {"one": "completed", "two": "pending", "three": "pending"}
    event = JobEvent.objects.get(job_id=new.pk, transition="retry_from")
    assert event.actor_id == staff.pk and event.metadata["from_step"] == "two"
    assert event.metadata["reused"] == ["one"]


@pytest.mark.parametrize(
    ("kind", "step", "message"),
    [
        ("wf.fixable", "nope", "'nope' is not a step of wf.fixable (one, two, three)."),
        (
            "wf.fixable",
            "three",
            "Cannot retry from 'three': earlier step(s) two did not complete (or were undone); retry "
            "from the first of them.",
        ),
        ("test.echo", "one", "'test.echo' is not a registered workflow."),
    ],
)
def test_retry_from_a_step_it_cannot_start_at_is_a_400_on_from_step(user, staff_user, kind, step, message):
    old = failed_workflow(user) if kind == "wf.fixable" else failed(user)
    before = Job.objects.count()
    staff = grant(staff_user, "view_job", "retry_job")
    response = client_for(staff).post(job_url(old, "retry/"), {"from_step": step}, format="json")
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"from_step": [message]}
    assert Job.objects.count() == before and not JobEvent.objects.filter(transition="retry_from").exists()


def test_retry_from_a_step_answers_a_parameters_error_as_a_plain_retry_does(user, staff_user, monkeypatch):
    # It was blamed on from_step (400 invalid, fields.from_step), a field that was right.
    from jobstate.exceptions import InvalidParameters
    from jobstate.registry import get_handler

    old = failed_workflow(user)
    staff = grant(staff_user, "view_job", "retry_job")

    def refuse(self: Any, parameters: Any, **options: Any) -> Any:
        raise InvalidParameters({"n": ["This field is required."]})

    monkeypatch.setattr(type(get_handler("wf.fixable")), "validate", refuse)
    plain = assert_error(client_for(staff).post(job_url(old, "retry/"), {}, format="json"), 400)
    stepped = assert_error(
        client_for(staff).post(job_url(old, "retry/"), {"from_step": "two"}, format="json"), 400
    )
    assert plain["code"] == "invalid_parameters"
    assert (stepped["code"], stepped["fields"]) == (plain["code"], plain["fields"])


def test_staff_need_the_permission_to_retry_someone_elses_job(user, staff_user):
    job = failed(user)
    staff_user = grant(staff_user, "view_job")
    assert_error(client_for(staff_user).post(job_url(job, "retry/")), 403, "permission_denied")
    grant(staff_user, "retry_job")
    staff = type(staff_user).objects.get(pk=staff_user.pk)
    response = client_for(staff).post(job_url(job, "retry/"))
    assert response.status_code == 201
    assert Job.objects.get(pk=response.json()["id"]).owner == user  # still the owner's job


# History ----------------------------------------------------------------------


def test_events_list_the_history_in_order(user):
    job = failed(user, error="disk full")
    events = client_for(user).get(job_url(job, "events/")).json()["results"]
    assert [(e["from_status"], e["to_status"], e["transition"]) for e in events] == [
        (None, "queued", "enqueue"),
        ("queued", "processing", "claim"),
        ("processing", "failed", "fail"),
    ]
    assert events[1]["actor"] == "worker:test-worker"
    assert events[2]["reason"] == "disk full"
    assert events[0]["created_at"] <= events[2]["created_at"]
    # The traceback stays out of the API.
    assert "traceback" not in events[2]["metadata"]
    assert events[2]["metadata"]["error_type"] == "RuntimeError"


def test_events_show_the_user_behind_a_change(user):
    job = make_job(user)
    client_for(user).post(job_url(job, "cancel/"), {"reason": "oops"}, format="json")
    last = client_for(user).get(job_url(job, "events/"), {"ordering": "-created_at"}).json()["results"][0]
    assert (last["actor"], last["user"], last["reason"]) == ("api", "alice", "oops")


def test_events_are_paginated(user):
    job = running(user)
    for _ in range(4):
        services.request_stop(job, "tester")
    client = client_for(user)
    page = client.get(job_url(job, "events/"), {"page_size": 2}).json()
    seen = [e["id"] for e in page["results"]]
    while page["next"]:
        page = client.get(page["next"]).json()
        seen += [e["id"] for e in page["results"]]
    assert seen == list(
        JobEvent.objects.filter(job=job).order_by("created_at", "id").values_list("id", flat=True)
    )


def test_events_query_count(user, django_assert_num_queries):
    job = failed(user)
    client = client_for(user)
    with django_assert_num_queries(3):  # token + user, visibility, the page (actor joined)
        assert client.get(job_url(job, "events/")).status_code == 200


# Operator remedies and stuck jobs -------------------------------------------------


def lost(owner):  # type: ignore[no-untyped-def]
    """A processing job whose worker vanished an hour ago (its lease expired)."""
    job = make_job(owner)
    return services.start(job, "gone-worker", lease_seconds=60, now=timezone.now() - dt.timedelta(hours=1))


def test_stuck_lists_the_callers_jobs_with_reason_and_remedy(user, other_user, staff_user):
    mine, theirs = lost(user), lost(other_user)
    findings = client_for(user).get("/api/jobs/stuck/").json()
    assert [(f["job"], f["reason"], f["remedy"]) for f in findings] == [
        (str(mine.pk), "lease_expired", "requeue")
    ]
    assert findings[0]["since"] and findings[0]["text"]
    assert client_for(staff_user).get("/api/jobs/stuck/").json() == []  # staff status alone
    staff = {f["job"] for f in client_for(grant(staff_user, "view_job")).get("/api/jobs/stuck/").json()}
    assert staff == {str(mine.pk), str(theirs.pk)}
    assert client_for(user).get("/api/jobs/stuck/", {"reason": "recently_failed"}).json() == []
    assert_error(client_for(user).get("/api/jobs/stuck/", {"reason": "bored"}), 400, "invalid")


@pytest.mark.parametrize(
    "values, message",
    [
        ([""], "'reason' may not be empty."),
        (["lease_expired", ""], "'reason' may not be empty."),
        (["bored"], "'bored' is not one of: {}."),
    ],
)
def test_a_bad_stuck_reason_gets_one_clear_message(user, values, message):
    # An empty one was '"" is not a valid choice.', a wrong one did not say the choices.
    error = assert_error(client_for(user).get("/api/jobs/stuck/", {"reason": values}), 400, "invalid")
    expected = message.format(", ".join(r.code for r in REASONS))
    assert error["fields"] == {"reason": [expected]}


def test_stuck_since_is_in_the_apis_utc_format(user):
    # As every other date-time of the API ("…Z"), not isoformat's "+00:00".
    job = lost(user)
    [finding] = client_for(user).get("/api/jobs/stuck/").json()
    assert finding["since"].endswith("Z"), finding["since"]
    assert dt.datetime.fromisoformat(finding["since"]) == Job.objects.get(pk=job.pk).lease_expires_at


def test_owners_cannot_use_operator_remedies(user):
    job = lost(user)
    assert "requeue" not in client_for(user).get(job_url(job)).json()["allowed_actions"]
    assert_error(client_for(user).post(job_url(job, "requeue/")), 403, "permission_denied")
    assert_error(client_for(user).post(job_url(job, "fail/"), {"reason": "x"}), 403, "permission_denied")
    assert Job.objects.get(pk=job.pk).status == "processing"


def test_an_operator_requeues_a_stuck_job(user, staff_user):
    job = lost(user)
    grant(staff_user, "requeue_job", "view_job")
    client = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    assert client.get(job_url(job)).json()["allowed_actions"] == ["requeue", "fail"]
    response = client.post(job_url(job, "requeue/"), {"reason": "worker host died"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued"
    event = JobEvent.objects.filter(job=job).last()
    assert (event.transition, event.actor_label, event.actor_id, event.reason) == (
        "requeue",
        "api",
        staff_user.pk,
        "worker host died",
    )
    # The lost worker's token no longer works.
    with pytest.raises(LeaseLost):
        services.heartbeat(job, job.lease_token)
    # Requeueing a queued job is refused, naming its state (it said "Cannot move job from
    # 'queued' to 'queued' (requeue)").
    error = assert_error(client.post(job_url(job, "requeue/")), 409, "invalid_transition")
    assert error["message"] == "The job is queued; only a running or waiting job can be requeued."


def test_an_operator_requeue_of_a_live_lease_waits_for_it_to_run_out(user, staff_user):
    job = running(user)
    grant(staff_user, "requeue_job", "view_job")
    client = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    response = client.post(job_url(job, "requeue/"), {"reason": "worker hung"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued"
    assert Job.objects.get(pk=job.pk).run_after == job.lease_expires_at > timezone.now()
    assert body["run_after"] == job.lease_expires_at.isoformat().replace("+00:00", "Z")
    assert services.claim("w2") == []


def test_an_operator_fails_a_job_with_a_reason(user, staff_user):
    job = make_job(user)
    grant(staff_user, "requeue_job", "view_job")
    client = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    assert_error(client.post(job_url(job, "fail/"), {}, format="json"), 400, "invalid")
    response = client.post(job_url(job, "fail/"), {"reason": "bad input file"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["error_message"], body["error_type"]) == (
        "failed",
        "bad input file",
        "OperatorFailed",
    )
    error = assert_error(
        client.post(job_url(job, "fail/"), {"reason": "again"}, format="json"), 409, "invalid_transition"
    )
    assert error["message"] == "The job is failed; only a queued, waiting or running job can be failed."


@pytest.mark.parametrize("action", ["cancel", "retry", "requeue", "fail"])
def test_an_unknown_action_field_is_a_400_naming_it_and_changes_nothing(user, staff_user, action):
    # {"reasn": ...} was ignored: the job was cancelled (retried, …) with no reason recorded.
    job = failed(user) if action == "retry" else running(user)
    if action in ("requeue", "fail"):  # operator remedies
        grant(staff_user, "requeue_job", "view_job")
        client = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    else:
        client = client_for(user)
    before = list(Job.objects.values()), JobEvent.objects.count()
    body = {"reason": "x", "reasn": "typo", "status": "cancelled"}
    error = assert_error(client.post(job_url(job, f"{action}/"), body, format="json"), 400, "invalid")
    assert error["fields"] == {"reasn": ["Unknown field."], "status": ["Unknown field."]}
    assert error["message"] == "reasn: Unknown field."
    assert (list(Job.objects.values()), JobEvent.objects.count()) == before


def _job_in(status: str, owner: Any) -> Job:
    job = make_job(owner)
    if status == Status.QUEUED:
        return job
    (held,) = services.claim("w1")
    if status == Status.WAITING:
        make_job(owner, parent=held)  # it waits for this child
        services.suspend(held, held.lease_token)
    elif status == Status.COMPLETED:
        services.complete(held, held.lease_token, {"ok": True})
    elif status == Status.PARTIAL:
        services.mark_partial(held, held.lease_token, {"some": 1}, "the rest is missing")
    elif status == Status.FAILED:
        services.force_fail(held, "ops", "broken")
    elif status == Status.CANCELLED:
        services.cancel_now(held, held.lease_token, reason="stop")
    job = Job.objects.get(pk=job.pk)
    assert job.status == status
    return job


class _Undo(Exception):
    pass


def _service_accepts(action: str, job: Job) -> bool:
    call = {
        "cancel": services.request_cancel,
        "retry": services.retry,
        "requeue": services.requeue,
        "fail": services.force_fail,
    }[action]
    try:
        with transaction.atomic():
            call(job.pk, "ops", "probe")
            raise _Undo
    except InvalidTransition:
        return False
    except _Undo:
        return True


@pytest.mark.parametrize("status", Status.values)
def test_allowed_actions_are_what_the_services_accept(user, staff_user, status):
    # A waiting job's allowed_actions left out requeue, which services.requeue does (it wakes it).
    job = _job_in(status, user)
    staff = grant(staff_user, "view_job", "cancel_job", "retry_job", "requeue_job")
    shown = client_for(staff).get(job_url(job)).json()["allowed_actions"]
    accepted = [a for a in ("cancel", "retry", "requeue", "fail") if _service_accepts(a, job)]
    assert shown == accepted
