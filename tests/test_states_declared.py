"""Issue 11: the JobStep state machine declared once and applied through the
service layer; "waiting for children" is a job status; issue 10: a workflow that
ends failed or cancelled ends its active children."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import InvalidTransition, LeaseLost, StepStateError
from jobstate.models import Job, JobEvent, JobStep
from jobstate.models.step import StepStatus
from jobstate.services import Actor
from jobstate.states import ACTIVE, Status
from jobstate.workflows import step_undos, steps

pytestmark = pytest.mark.django_db

S = StepStatus


def claimed_workflow() -> Job:
    services.enqueue("wf.five", {})
    (job,) = services.claim("w1", limit=1)
    steps.ensure(job, job.lease_token, ["s1", "s2"])
    return job


def snapshot(job: Job) -> tuple[Any, ...]:
    job.refresh_from_db()
    rows = tuple(JobStep.objects.filter(job_id=job.pk).order_by("position").values_list("status", "attempts"))
    return rows, JobEvent.objects.filter(job_id=job.pk).count(), job.progress, job.current_step


def test_step_transitions_are_declared_on_the_model():
    table = services.all_step_transitions()
    assert ("pending", "running", "start") in table
    assert ("completed", "undone", "undo") in table
    assert not [t for t in table if t[0] == "pending" and t[1] == "completed"]
    assert {t[2] for t in table} == {
        "start", "serve", "wait", "resume_wait", "complete", "fail", "lose", "undo", "skip"
    }  # fmt: skip


def test_an_invalid_step_transition_is_refused_with_nothing_written():
    job = claimed_workflow()
    pending = JobStep.objects.get(job_id=job.pk, name="s1")
    before = snapshot(job)
    with pytest.raises(StepStateError) as refused:
        steps.complete(job, job.lease_token, pending, {"x": 1}, percent=50)  # pending -> completed
    assert refused.value.current == S.PENDING
    with pytest.raises(StepStateError):
        step_undos.undone(job, job.lease_token, "s1", because="x")  # pending -> undone
    with pytest.raises(StepStateError):
        services.move_step(job.pk, "s2", "serve", actor=Actor.system("t"), job_status=Status.PROCESSING)
    with pytest.raises(StepStateError):
        services.move_step(job.pk, "nope", "start", actor=Actor.system("t"), job_status=Status.PROCESSING)
    assert snapshot(job) == before  # no step, no history row, not even the job's progress


def test_move_step_refuses_a_naive_now_with_use_tz_and_writes_nothing():
    # It wrote the step and its history row, Django only warning (a naive time taken
    # as if in the default time zone); the other services refuse one.
    job = claimed_workflow()
    before = snapshot(job)
    for now, message in ((datetime.now(), "now is a timezone-aware datetime."), (1, "now is a datetime.")):
        with pytest.raises(ValidationError) as refused:
            services.move_step(
                job.pk, "s1", "start", actor=Actor.system("t"), job_status=Status.PROCESSING, now=now
            )
        assert refused.value.message_dict == {"now": [message]}
    assert snapshot(job) == before
    aware = timezone.now()
    running = Status.PROCESSING
    services.move_step(job.pk, "s1", "start", actor=Actor.system("t"), job_status=running, now=aware)
    assert JobStep.objects.get(job_id=job.pk, name="s1").updated_at == aware


def test_each_step_transition_writes_one_history_row_in_its_transaction():
    job = claimed_workflow()
    row = JobStep.objects.get(job_id=job.pk, name="s1")
    events = JobEvent.objects.filter(job_id=job.pk)
    start = events.count()
    steps.begin(job, job.lease_token, row, percent=0)
    steps.complete(job, job.lease_token, row, 1, percent=50)
    got = list(events.order_by("id")[start:].values_list("transition", "metadata"))
    assert [(name, m["step"], m["from"], m["to"]) for name, m in got] == [
        ("step_started", "s1", "pending", "running"),
        ("step_completed", "s1", "running", "completed"),
    ]
    assert JobStep.objects.get(pk=row.pk).status == S.COMPLETED


def test_a_step_transition_under_a_lost_lease_writes_nothing():
    job = claimed_workflow()
    row = JobStep.objects.get(job_id=job.pk, name="s1")
    services.requeue(job, "ops")
    before = JobEvent.objects.filter(job_id=job.pk).count()
    with pytest.raises(LeaseLost):
        steps.begin(job, job.lease_token, row, percent=0)
    assert JobStep.objects.get(pk=row.pk).status == S.PENDING
    assert JobEvent.objects.filter(job_id=job.pk).count() == before


# --- waiting is a status ---------------------------------------------------------


def waiting_parent(children: int = 2) -> tuple[Job, list[Job]]:
    services.enqueue("test.echo", {})
    (parent,) = services.claim("w1", limit=1)
    kids = [services.enqueue("test.echo", {"n": i}, parent=parent) for i in range(children)]
    services.suspend(parent, parent.lease_token)
    parent.refresh_from_db()
    return parent, kids


def test_a_parent_waits_by_status_and_is_never_claimed():
    parent, _kids = waiting_parent()
    assert parent.status == Status.WAITING and parent.attempts == 0 and parent.lease_token is None
    assert Status.WAITING in ACTIVE
    assert list(Job.objects.waiting()) == [parent]
    claimed = services.claim("w2", limit=10)
    assert parent.pk not in {j.pk for j in claimed}
    assert JobEvent.objects.filter(job=parent).latest("id").transition == "suspend"


def test_the_last_child_wakes_its_parent_with_a_history_row():
    parent, kids = waiting_parent()
    for kid in kids:
        services.request_cancel(kid, "ops")
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED and parent.run_after <= timezone.now()
    wake = JobEvent.objects.filter(job=parent).latest("id")
    assert (wake.from_status, wake.to_status, wake.transition) == ("waiting", "queued", "wake")


def test_suspending_with_no_active_child_wakes_at_once():
    services.enqueue("test.echo", {})
    (parent,) = services.claim("w1", limit=1)
    services.suspend(parent, parent.lease_token)
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED
    assert list(JobEvent.objects.filter(job=parent).values_list("transition", flat=True)) == [
        "enqueue", "claim", "suspend", "wake"
    ]  # fmt: skip


def test_an_operator_requeue_wakes_a_waiting_job():
    parent, _kids = waiting_parent()
    services.requeue(parent, "ops")
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED


def test_waiting_jobs_cannot_be_claimed_completed_or_requeued_by_a_worker():
    parent, _kids = waiting_parent()
    with pytest.raises(InvalidTransition):
        services.transitions.move(parent, "claim", actor=Actor.system("t"))


# --- failure and cancel cascade to the children ------------------------------------


def test_force_fail_ends_the_active_children_each_naming_the_parent():
    parent, (queued, running) = waiting_parent()
    services.start(running, "w-child")
    grandchild = services.enqueue("test.echo", {}, parent=queued)
    services.force_fail(parent, "ops", "broken upstream")
    parent.refresh_from_db()
    assert parent.status == Status.FAILED
    queued.refresh_from_db()
    running.refresh_from_db()
    grandchild.refresh_from_db()
    assert queued.status == Status.CANCELLED and grandchild.status == Status.CANCELLED
    assert running.status == Status.PROCESSING and running.cancel_requested_at is not None
    for child, transition in ((queued, "cancel"), (running, "request_cancel")):
        event = JobEvent.objects.filter(job=child).latest("id")
        assert event.transition == transition
        assert str(parent.pk) in event.reason and event.metadata["parent"] == str(parent.pk)
        assert event.metadata["cascade"] == Status.FAILED
    assert JobEvent.objects.filter(job=grandchild).latest("id").metadata["parent"] == str(queued.pk)


def test_a_refused_fail_cascades_nothing():
    services.enqueue("test.echo", {}, max_attempts=1)
    (parent,) = services.claim("w1", limit=1)
    kid = services.enqueue("test.echo", {}, parent=parent)
    with pytest.raises(LeaseLost):
        services.fail(parent, uuid.uuid4(), "boom", retry=False)  # not its lease
    kid.refresh_from_db()
    assert kid.status == Status.QUEUED and JobEvent.objects.filter(job=kid).count() == 1


def test_a_worker_failing_a_parent_for_good_cancels_its_children():
    services.enqueue("test.echo", {}, max_attempts=1)
    (parent,) = services.claim("w1", limit=1)
    kid = services.enqueue("test.echo", {}, parent=parent)
    services.fail(parent, parent.lease_token, "boom", retry=False)
    kid.refresh_from_db()
    assert kid.status == Status.CANCELLED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("max_attempts", [2, 1], ids=["retried", "failed"])
def test_a_failing_child_locks_its_parent_once(temp_handler, max_attempts):
    """The worker's end of the attempt, ``services.fail`` and its ``move`` are one
    transaction: each locked the parent's row again (2 statements for a retry, 3 for
    the final failure)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobstate.worker.runner import run_next

    def boom(ctx: Any) -> None:
        raise RuntimeError("boom")

    temp_handler("t.parent")
    temp_handler("t.boom", boom, max_attempts=max_attempts)
    parent = services.enqueue("t.parent", {})
    child = services.enqueue("t.boom", {}, parent=parent)
    with CaptureQueriesContext(connection) as queries:
        assert run_next("w", kinds=["t.boom"]).pk == child.pk
    child.refresh_from_db()
    assert child.status == (Status.QUEUED if max_attempts > 1 else Status.FAILED)
    hexes = (str(parent.pk), parent.pk.hex)
    locks = [
        q["sql"] for q in queries if "FOR NO KEY UPDATE" in q["sql"] and any(h in q["sql"] for h in hexes)
    ]
    assert len(locks) == (1 if connection.features.has_select_for_update else 0), locks


def test_waiting_jobs_are_found_by_status_in_the_api_and_the_admin(admin_client: Any, admin_user: Any):
    from django.urls import reverse

    from tests.api_support import JOBS, client_for

    parent, kids = waiting_parent()
    Job.objects.filter(pk__in=[parent.pk, *[k.pk for k in kids]]).update(owner=admin_user)
    response = client_for(admin_user).get(JOBS, {"status": "waiting"})
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [str(parent.pk)]
    page = admin_client.get(reverse("admin:jobstate_job_changelist"), {"status": "waiting"})
    html = page.content.decode()
    assert page.status_code == 200 and str(parent.pk) in html
    assert str(kids[0].pk) not in html
