"""``undo_on_cancel`` on a child: a workflow cancelled by its parent's end (the
cascade) gets the run for its undos that a cancel of it alone would give it
(tests/workflow_jobs.py: ``wf.provision_undo`` fans out ``wf.child``, or the kind
its ``child_kind`` names)."""

from __future__ import annotations

import pytest

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.services.control import cancel_run_pending
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job, run_next
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)
DONE = ["provision", "reserve", "work"]
UNDONE = ["undo:reserve:S1", "undo:provision:K1"]
RUN_FIRST = "cancel requested: its undos run first"


def labels(job: Job) -> list[str]:
    return list(Effect.objects.filter(job_id=job.pk).order_by("id").values_list("label", flat=True))


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def last_row(job: Job) -> JobEvent:
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None
    return row


def moves(job: Job) -> list[tuple[str, str, str]]:
    return [
        (e.transition, e.from_status, e.to_status)
        for e in JobEvent.objects.filter(job_id=job.pk).exclude(transition__startswith="step_").order_by("id")
    ]


def _family(parent_kind: str, child_fan_out: int = 1) -> tuple[Job, Job]:
    """A parent waiting for its one child, a ``wf.provision_undo`` that ran its steps
    (and, with ``child_fan_out``, waits for its own ``wf.child``)."""
    parent = services.enqueue(
        parent_kind,
        {"fan_out": 1, "child_kind": "wf.provision_undo", "child_parameters": {"fan_out": child_fan_out}},
    )
    assert run_next("w1", kinds=[parent_kind]) is not None
    assert fresh(parent).status == Status.WAITING
    child = Job.objects.get(parent=parent)
    run_job(services.start(child.pk, "w1"), "w1")
    return fresh(parent), fresh(child)


def _assert_run_given(child: Job, parent: Job, transition: str, from_status: str, to_status: str) -> None:
    child = fresh(child)
    assert child.status == to_status and child.cancel_requested_at is not None
    row = last_row(child)
    assert (row.transition, row.from_status, row.to_status) == (transition, from_status, to_status)
    assert row.actor_label == "ops"
    assert row.reason == f"parent {parent.pk} cancelled; {RUN_FIRST}"
    assert row.metadata == {"parent": str(parent.pk), "cascade": "cancelled", "recovery": "cancel"}
    assert cancel_run_pending(child) == (to_status == Status.QUEUED)


def test_a_waiting_child_cancelled_by_its_parent_runs_its_undos_and_its_own_child_is_cancelled():
    parent, child = _family("wf.provision")
    assert child.status == Status.WAITING
    grandchild = Job.objects.get(parent=child)

    services.request_cancel(parent, "ops", "not needed")
    assert fresh(parent).status == Status.CANCELLED  # the parent's own cancel: at once, as before
    _assert_run_given(child, parent, "wake", "waiting", "queued")
    grandchild = fresh(grandchild)
    assert grandchild.status == Status.CANCELLED  # the child's children cascade as usual
    assert last_row(grandchild).reason == f"parent {child.pk} cancelled"

    assert drain(kinds=["wf.provision_undo"]) == 1
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == [*DONE, *UNDONE]
    assert moves(child)[-3:] == [
        ("wake", "waiting", "queued"),
        ("claim", "queued", "processing"),
        ("cancel", "processing", "cancelled"),
    ]
    assert fresh(parent).status == Status.CANCELLED


def test_parent_child_grandchild_each_workflow_that_ran_runs_its_undos():
    # parent -> child -> grandchild -> a plain great-grandchild, each waiting for the next.
    nested = {"fan_out": 1, "child_kind": "wf.provision_undo", "child_parameters": {"fan_out": 1}}
    parent = services.enqueue(
        "wf.provision", {"fan_out": 1, "child_kind": "wf.provision_undo", "child_parameters": nested}
    )
    assert run_next("w1", kinds=["wf.provision"]) is not None
    child = Job.objects.get(parent=parent)
    run_job(services.start(child.pk, "w1"), "w1")
    grandchild = Job.objects.get(parent=child)
    run_job(services.start(grandchild.pk, "w1"), "w1")
    plain = Job.objects.get(parent=grandchild)
    assert [fresh(j).status for j in (parent, child, grandchild, plain)] == [
        Status.WAITING,
        Status.WAITING,
        Status.WAITING,
        Status.QUEUED,
    ]

    services.request_cancel(parent, "ops", "")
    assert fresh(parent).status == Status.CANCELLED
    assert fresh(plain).status == Status.CANCELLED
    _assert_run_given(child, parent, "wake", "waiting", "queued")
    grandchild = fresh(grandchild)
    assert grandchild.status == Status.QUEUED and cancel_run_pending(grandchild)
    row = last_row(grandchild)
    assert (row.transition, row.actor_label) == ("wake", "ops")
    assert row.reason == f"parent {child.pk} cancelled; {RUN_FIRST}"
    assert row.metadata == {"parent": str(child.pk), "cascade": "cancelled", "recovery": "cancel"}

    assert drain(kinds=["wf.provision_undo"]) == 2
    for job in (child, grandchild):
        assert fresh(job).status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_a_parent_that_runs_its_own_undos_ends_cancelled_and_leaves_its_childs_run_be():
    parent, child = _family("wf.provision_undo")
    services.request_cancel(parent, "ops", "not needed")
    assert fresh(parent).status == Status.QUEUED  # its own run for its undos, as before
    _assert_run_given(child, parent, "wake", "waiting", "queued")

    # The parent's run ends it cancelled: its end does not cancel the child's pending run.
    assert run_job(services.start(parent.pk, "w2"), "w2") == "cancelled"
    parent = fresh(parent)
    assert parent.status == Status.CANCELLED and labels(parent) == [*DONE, *UNDONE]
    _assert_run_given(child, parent, "wake", "waiting", "queued")

    assert drain(kinds=["wf.provision_undo"]) == 1
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == [*DONE, *UNDONE]


def test_a_running_parent_asked_to_cancel_gives_its_waiting_child_its_run_once():
    parent, child = _family("wf.provision")
    services.requeue(parent, "ops")  # woken: it runs again now
    started = services.start(parent.pk, "w2")
    assert started is not None
    services.request_cancel(parent, "ops", "")
    _assert_run_given(child, parent, "wake", "waiting", "queued")
    services.cancel_now(started, started.lease_token)  # its worker honours the request
    assert fresh(parent).status == Status.CANCELLED
    _assert_run_given(child, parent, "wake", "waiting", "queued")
    assert drain(kinds=["wf.provision_undo"]) == 1
    assert labels(fresh(child)) == [*DONE, *UNDONE]


@pytest.mark.parametrize("reserved", [False, True])
def test_a_queued_or_reserved_child_that_ran_runs_its_undos(reserved: bool):
    parent, child = _family("wf.provision")
    assert drain(kinds=["wf.child"]) == 1
    assert fresh(child).status == Status.QUEUED  # woken, not yet run
    claimed = services.claim("w9", kinds=["wf.provision_undo"]) if reserved else []
    services.request_cancel(parent, "ops", "")
    status = Status.PROCESSING if reserved else Status.QUEUED
    _assert_run_given(child, parent, "request_cancel", status, status)
    if reserved:
        assert run_job(claimed[0], "w9") == "cancelled"
    else:
        assert drain(kinds=["wf.provision_undo"]) == 1
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == [*DONE, *UNDONE]


def test_a_child_that_never_ran_is_cancelled_at_once():
    parent = services.enqueue("wf.provision", {"fan_out": 1, "child_kind": "wf.provision_undo"})
    assert run_next("w1", kinds=["wf.provision"]) is not None
    child = Job.objects.get(parent=parent)
    services.request_cancel(parent, "ops", "")
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == []
    assert moves(child) == [("enqueue", "", "queued"), ("cancel", "queued", "cancelled")]
    assert last_row(child).metadata == {"parent": str(parent.pk), "cascade": "cancelled"}


def test_a_parent_failed_by_an_operator_gives_its_child_the_run_too():
    parent, child = _family("wf.provision")
    services.force_fail(parent, "ops", "broken")
    child = fresh(child)
    assert child.status == Status.QUEUED
    row = last_row(child)
    assert row.reason == f"parent {parent.pk} failed; {RUN_FIRST}"
    assert row.metadata == {"parent": str(parent.pk), "cascade": "failed", "recovery": "cancel"}
    assert drain(kinds=["wf.provision_undo"]) == 1
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == [*DONE, *UNDONE]


def test_force_cancel_ends_a_child_whose_undo_run_no_worker_takes():
    parent, child = _family("wf.provision")
    services.request_cancel(parent, "ops", "")
    services.force_cancel(child, "ops", "give up")
    child = fresh(child)
    assert child.status == Status.CANCELLED and labels(child) == DONE
    assert "undos not run" in last_row(child).reason
    assert drain() == 0


def test_a_second_cancel_of_the_child_leaves_its_pending_run_be():
    parent, child = _family("wf.provision")
    services.request_cancel(parent, "ops", "")
    before = JobEvent.objects.filter(job_id=child.pk).count()
    services.request_cancel(child, "someone", "again")
    assert JobEvent.objects.filter(job_id=child.pk).count() == before
    _assert_run_given(child, parent, "wake", "waiting", "queued")
