"""``@jobstate.workflow(..., undo_on_cancel=True)``: a cancelled workflow runs the
undos of its completed steps, last first, then ends ``cancelled`` (tests/workflow_jobs.py:
``wf.provision_undo``; ``wf.provision`` is the same workflow without the option)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

import jobstate
from jobstate import registry, services, stuck
from jobstate.exceptions import InvalidTransition
from jobstate.ids import short
from jobstate.models import Job, JobEvent, JobStep
from jobstate.services.recovery_runs import recovery_action
from jobstate.services.transitions import refunded
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job, run_next
from tests.models import Effect
from tests.workflow_jobs import ProvisionUndo, SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)
DONE = ["provision", "reserve", "work"]
UNDONE = ["undo:reserve:S1", "undo:provision:K1"]


def labels(job: Job) -> list[str]:
    return list(Effect.objects.filter(job_id=job.pk).order_by("id").values_list("label", flat=True))


def statuses(job: Job) -> dict[str, str]:
    return dict(JobStep.objects.filter(job_id=job.pk).values_list("name", "status"))


def history(job: Job, since: str = "") -> list[tuple[str, str, str, str]]:
    """(transition, from, to, step) of the job's history rows, from the last ``since`` row on."""
    rows = [
        (e.transition, e.from_status, e.to_status, (e.metadata or {}).get("step", ""))
        for e in JobEvent.objects.filter(job_id=job.pk).order_by("id")
    ]
    if since:
        start = max(i for i, row in enumerate(rows) if row[0] == since)
        rows = rows[start:]
    return rows


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


UNDO_ROWS = [
    ("step_undone", "processing", "processing", "reserve"),
    ("step_undone", "processing", "processing", "provision"),
    ("cancel", "processing", "cancelled", ""),
]
# A run that met its cancel as it ran marks itself before its undos (``recovery: cancel``).
MARK_ROW = ("compensate_cancel", "processing", "processing", "")


# While a step runs ---------------------------------------------------------------


def test_a_cancel_while_a_step_runs_undoes_the_completed_steps_in_reverse_order():
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work"})
    assert run_next("w1").status == Status.CANCELLED
    job = fresh(job)
    assert job.status == Status.CANCELLED and job.error_message == ""
    assert labels(job) == [*DONE, *UNDONE]
    steps = {"provision": "undone", "reserve": "undone", "work": "running", "report": "pending"}
    assert statuses(job) == steps
    assert history(job, since="request_cancel") == [
        ("request_cancel", "processing", "processing", ""),
        MARK_ROW,
        *UNDO_ROWS,
    ]
    undone = JobEvent.objects.filter(job_id=job.pk, transition="step_undone").first()
    assert undone is not None and undone.reason == "compensating: cancel requested"
    mark = JobEvent.objects.get(job_id=job.pk, transition="compensate_cancel")
    assert mark.metadata == {"recovery": "cancel"} and mark.actor_label == "worker:w1"
    assert mark.reason == "cancel requested as it ran: its undos run first"


def test_an_interrupt_that_rolls_back_the_mark_of_a_cancels_undos_does_not_lose_it():
    # The watchdog interrupts a run once (its timeout, or the cancel's grace): landing in the
    # mark's transaction, it rolled the row back and the undos ran unmarked ("cancel not
    # honoured" on the stuck page while they ran).
    from jobstate.exceptions import Interrupted
    from jobstate.services import recovery_runs

    real = recovery_runs.record_event
    calls: list[int] = []

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Interrupted("timeout")
        return real(*args, **kwargs)

    job = services.enqueue("wf.provision_undo", {"cancel_in": "work"})
    with mock.patch.object(recovery_runs, "record_event", interrupted_once):
        assert run_next("w1").status == Status.CANCELLED
    assert len(calls) == 2
    assert history(fresh(job), since="request_cancel") == [
        ("request_cancel", "processing", "processing", ""),
        MARK_ROW,
        *UNDO_ROWS,
    ]


def test_without_the_option_a_cancel_runs_no_undo():
    job = services.enqueue("wf.provision", {"cancel_in": "work"})
    assert run_next("w1").status == Status.CANCELLED
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == DONE
    assert statuses(job) == {
        "provision": "completed",
        "reserve": "completed",
        "work": "running",
        "report": "pending",
    }
    assert history(job, since="request_cancel") == [
        ("request_cancel", "processing", "processing", ""),
        ("cancel", "processing", "cancelled", ""),
    ]


def test_an_undo_that_fails_on_a_cancel_is_recorded_and_the_others_still_run():
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work", "release_fails": True})
    assert run_next("w1").status == Status.CANCELLED
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == [*DONE, *UNDONE]
    assert statuses(job)["reserve"] == "completed" and statuses(job)["provision"] == "undone"
    reserve = JobStep.objects.get(job_id=job.pk, name="reserve")
    assert reserve.detail["undo_error"] == "RuntimeError: slot service down"
    assert history(job, since="request_cancel")[1:] == [
        MARK_ROW,
        ("step_undo_failed", "processing", "processing", "reserve"),
        *UNDO_ROWS[1:],
    ]


def test_a_cancel_as_a_step_fans_out_starts_no_child_and_undoes():
    # The step spawned, then the cancel came: its fan-out finds it pending.
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work", "fan_out": 2})
    assert run_next("w1").status == Status.CANCELLED
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == [*DONE, *UNDONE]
    assert not Job.objects.filter(parent=job).exists()
    assert history(job, since="request_cancel")[1:] == [MARK_ROW, *UNDO_ROWS]


def test_a_worker_lost_in_the_undos_of_a_cancel_is_replaced_by_a_run_that_finishes_them():
    crash = {"crash_at": "undo:reserve", "crash_once": True}
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work", **crash})
    with pytest.raises(SimulatedCrash):
        run_next("w1")
    report = services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    assert report.requeued == [job.pk]  # not cancelled: its undos are not done
    job = fresh(job)
    assert job.status == Status.QUEUED and job.cancel_requested_at is not None
    requeue = JobEvent.objects.get(job_id=job.pk, transition="requeue")
    assert requeue.metadata["recovery"] == "compensate"
    assert requeue.reason.endswith("cancel requested: its undos run first")
    assert run_job(services.start(job.pk, "w2"), "w2") == "cancelled"
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == [*DONE, "crash:undo:reserve", *UNDONE]
    assert history(job, since="requeue")[2:] == UNDO_ROWS  # after the claim and its step row


# While it waits for its children ----------------------------------------------------


def _waiting(kind: str) -> tuple[Job, Job]:
    job = services.enqueue(kind, {"fan_out": 3})
    assert run_next("w1").status == Status.WAITING
    (running,) = services.claim("w2", kinds=["wf.child"])
    assert fresh(job).status == Status.WAITING
    return fresh(job), running


def test_a_cancel_of_a_waiting_workflow_queues_it_for_its_undos_then_cancels_it():
    job, running = _waiting("wf.provision_undo")
    before = JobEvent.objects.filter(job_id=job.pk).count()
    services.request_cancel(job, "ops", "not needed")
    job = fresh(job)
    assert job.status == Status.QUEUED and job.cancel_requested_at is not None
    children = dict(Job.objects.filter(parent=job).values_list("pk", "status"))
    assert children.pop(running.pk) == Status.PROCESSING  # asked to cancel, as without the option
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    assert set(children.values()) == {Status.CANCELLED}
    wake = JobEvent.objects.filter(job_id=job.pk).order_by("id")[before]
    assert (wake.transition, wake.from_status, wake.to_status) == ("wake", "waiting", "queued")
    assert wake.actor_label == "ops" and wake.metadata == {"recovery": "cancel"}
    assert wake.reason == "not needed; cancel requested: its undos run first"

    # A second request leaves the pending run be (no second compensation).
    services.request_cancel(job, "ops", "really")
    assert fresh(job).status == Status.QUEUED
    assert JobEvent.objects.filter(job_id=job.pk).count() == before + 1

    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == [*DONE, *UNDONE]
    steps = {"provision": "undone", "reserve": "undone", "work": "waiting", "report": "pending"}
    assert statuses(job) == steps
    assert history(job, since="wake") == [
        ("wake", "waiting", "queued", ""),
        ("claim", "queued", "processing", ""),
        *UNDO_ROWS,
    ]
    assert job.attempts == 1  # the undo run spent the attempt its fan-out gave back


def test_without_the_option_a_cancel_of_a_waiting_workflow_cancels_it_at_once():
    job, _running = _waiting("wf.provision")
    services.request_cancel(job, "ops", "not needed")
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert labels(job) == DONE
    assert history(job)[-1] == ("cancel", "waiting", "cancelled", "")


def test_a_woken_workflow_queued_for_its_fan_in_runs_its_undos_on_a_cancel():
    job = services.enqueue("wf.provision_undo", {"fan_out": 1})
    assert run_next("w1").status == Status.WAITING
    assert drain(kinds=["wf.child"]) == 1
    assert fresh(job).status == Status.QUEUED  # woken, not yet run
    services.request_cancel(job, "ops", "")
    job = fresh(job)
    assert job.status == Status.QUEUED and job.cancel_requested_at is not None
    assert history(job)[-1] == ("request_cancel", "queued", "queued", "")
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]
    assert history(job, since="claim")[-3:] == UNDO_ROWS


# Queued before it ever ran -------------------------------------------------------


def test_a_workflow_cancelled_before_it_ever_ran_is_cancelled_at_once():
    job = services.enqueue("wf.provision_undo", {})
    services.request_cancel(job, "ops", "")
    job = fresh(job)
    assert job.status == Status.CANCELLED
    assert history(job) == [("enqueue", "", "queued", ""), ("cancel", "queued", "cancelled", "")]
    assert drain() == 0 and labels(job) == []


# The option ------------------------------------------------------------------------


def test_undo_on_cancel_is_true_or_false():
    with pytest.raises(TypeError, match="undo_on_cancel must be True or False"):

        @jobstate.workflow("t.bad_undo_on_cancel", undo_on_cancel="yes")  # type: ignore[arg-type]
        class Bad(jobstate.Workflow):
            @jobstate.step()
            def one(self, ctx: Any) -> None: ...

    assert "t.bad_undo_on_cancel" not in registry.all_handlers()


def test_a_plain_handler_cannot_take_the_option():
    with pytest.raises(TypeError, match="unknown option"):
        registry.handler("t.plain_undo_on_cancel", undo_on_cancel=True)


# Reserved by a cluster, not yet begun -----------------------------------------------


def _woken(kind: str = "wf.provision_undo") -> Job:
    job = services.enqueue(kind, {"fan_out": 1})
    assert run_next("w1").status == Status.WAITING
    assert drain(kinds=["wf.child"]) == 1
    job = fresh(job)
    assert job.status == Status.QUEUED  # woken, not yet run
    return job


def test_a_cancel_of_a_reserved_workflow_that_ran_before_runs_its_undos_when_it_begins():
    job = _woken()
    (claimed,) = services.claim("w9", kinds=["wf.provision_undo"])
    services.request_cancel(job, "ops", "stop")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and row.transition == "request_cancel"
    assert row.metadata == {"recovery": "cancel"}
    assert row.reason == "stop; cancel requested: its undos run first"
    assert run_job(claimed, "w9") == "cancelled"
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_a_reserved_workflow_whose_kind_was_paused_runs_the_undos_of_its_cancel_once_resumed():
    job = _woken()
    (claimed,) = services.claim("w9", kinds=["wf.provision_undo"])
    services.request_cancel(job, "ops", "stop")
    services.pause_kind("wf.provision_undo", "ops")
    # Its run for the undos is not begun while the kind is paused: handed back, and the
    # hand-back keeps what the run was for.
    assert run_job(claimed, "w9") == "paused"
    job = fresh(job)
    assert (job.status, job.attempts) == (Status.QUEUED, claimed.attempts)
    assert job.cancel_requested_at is not None and labels(job) == DONE
    services.resume_kind("wf.provision_undo", "ops")
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_a_reserved_workflow_whose_cluster_stopped_is_requeued_for_the_undos_of_its_cancel():
    job = _woken()
    services.claim("w9", kinds=["wf.provision_undo"])
    services.request_cancel(job, "ops", "stop")
    report = services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    assert report.requeued == [job.pk]  # not cancelled unstarted
    assert run_job(services.start(job.pk, "w2"), "w2") == "cancelled"
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_without_the_option_a_cancel_of_a_reserved_workflow_cancels_it_unstarted():
    job = _woken("wf.provision")
    (claimed,) = services.claim("w9", kinds=["wf.provision"])
    services.request_cancel(job, "ops", "stop")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and row.metadata == {} and row.reason == "stop"
    assert run_job(claimed, "w9") == "cancelled"
    assert labels(fresh(job)) == DONE


# A cancel that lands as the run suspends ----------------------------------------------


def _cancel_as_it_suspends(kind: str) -> Job:
    suspend = services.suspend

    def cancelled_first(job: Job, token: Any, **kwargs: Any) -> Any:
        services.request_cancel(job.pk, "ops", "stop")  # after the run's last look
        return suspend(job, token, **kwargs)

    job = services.enqueue(kind, {"fan_out": 1})
    with mock.patch.object(services, "suspend", cancelled_first):
        run_next("w1")
    return fresh(job)


def test_a_cancel_landing_as_the_workflow_suspends_queues_it_for_its_undos():
    job = _cancel_as_it_suspends("wf.provision_undo")
    assert job.status == Status.QUEUED and job.cancel_requested_at is not None
    assert job.attempts == 0  # refunded: the undo run spends it
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and (row.transition, row.to_status) == ("requeue", "queued")
    assert row.metadata == {"recovery": "cancel", "suspended": True}  # refunded, as a suspend
    assert refunded(row.metadata)
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_without_the_option_a_cancel_landing_as_the_workflow_suspends_cancels_it():
    job = _cancel_as_it_suspends("wf.provision")
    assert job.status == Status.CANCELLED and labels(job) == DONE


# What an undo of a cancel may call ----------------------------------------------------


def test_an_undo_of_a_cancel_may_beat_and_check_for_a_cancel_without_failing():
    job = services.enqueue("wf.provision_undo", {"fan_out": 1, "undo_checks": True})
    assert run_next("w1").status == Status.WAITING
    services.request_cancel(job, "ops", "stop")
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]
    assert statuses(job)["reserve"] == "undone"


# How long the undos of a cancel may take ------------------------------------------------

QUICK_GRACE = {"HEARTBEAT_SECONDS": 0.2, "CANCEL_GRACE_SECONDS": 0.3, "INTERRUPT_GRACE_SECONDS": 0.5}


@override_settings(JOBSTATE=QUICK_GRACE)
def test_the_undos_of_a_cancel_are_not_cut_off_by_the_cancel_grace_period():
    # Together they take longer than both graces: the job's timeout bounds them instead.
    job = services.enqueue("wf.provision_undo", {"fan_out": 1, "undo_seconds": 0.6})
    assert run_next("w1").status == Status.WAITING
    services.request_cancel(job, "ops", "stop")
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]
    assert statuses(job)["reserve"] == statuses(job)["provision"] == "undone"
    last = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert last is not None and last.reason == "cancel requested"  # not "stopped after the cancel grace"


# The stuck page --------------------------------------------------------------------------


def test_a_run_undoing_its_cancel_is_not_a_cancel_not_honoured():
    job = _woken()
    services.request_cancel(job, "ops", "stop")
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=long_ago)
    services.start(job.pk, "w2")  # its undo run begins
    job = fresh(job)
    assert stuck.check(job) is None
    assert not Job.objects.filter(stuck.any_stuck_q(), pk=job.pk).exists()
    # Its history says so, not the clocks: begun "before" the request by a worker's slow
    # clock (its request 3 min old), the run still honours it.
    asked = timezone.now() - timedelta(minutes=3)
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=asked, started_at=asked - timedelta(seconds=5))
    assert stuck.check(fresh(job)) is None
    assert not Job.objects.filter(stuck.any_stuck_q(), pk=job.pk).exists()


def _cancel_long_past(job_id: Any) -> tuple[Any, bool]:
    """(finding, listed) of the stuck check, the job's cancel made an hour old (the
    STUCK_CANCEL_UNHONOURED_SECONDS threshold, 120 s by default, long past)."""
    Job.objects.filter(pk=job_id).update(cancel_requested_at=timezone.now() - timedelta(hours=1))
    job = Job.objects.get(pk=job_id)
    return stuck.check(job), Job.objects.filter(stuck.any_stuck_q(), pk=job_id).exists()


@pytest.mark.parametrize(
    "parameters",
    [{"cancel_in": "work"}, {"cancel_in": "work", "fan_out": 2}],
    ids=["check_cancelled", "interrupted_as_it_fans_out"],
)
def test_a_run_undoing_the_cancel_it_met_as_a_step_ran_is_not_a_cancel_not_honoured(parameters):
    # The cancel stops a step; the same run undoes, its history marking it before the first
    # undo. Listed as "cancel not honoured" once the cancel was 120 s old, an operator might
    # force cancel it half-way through its undos.
    seen: list[tuple[Any, bool]] = []
    release = ProvisionUndo.release

    def looking(self: Any, ctx: Any, output: Any) -> None:
        seen.append(_cancel_long_past(ctx.job.pk))
        release(self, ctx, output)

    job = services.enqueue("wf.provision_undo", parameters)
    with mock.patch.object(ProvisionUndo, "release", looking):
        assert run_next("w1").status == Status.CANCELLED
    assert seen == [(None, False)]
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_the_mark_of_a_run_that_undid_its_cancel_does_not_shield_a_later_run():
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work"})
    assert run_next("w1").status == Status.CANCELLED
    assert recovery_action(job.pk) == "cancel"
    # Its retry is a new job: an ordinary run of it that ignores its cancel is listed.
    again = services.retry(job, "ops")
    services.start(again.pk, "w2")
    services.request_cancel(again, "ops", "stop")
    finding, listed = _cancel_long_past(again.pk)
    assert finding is not None and finding.reason == stuck.CANCEL_UNHONOURED and listed


def test_a_plain_run_begun_after_its_cancel_by_a_fast_clock_is_a_cancel_not_honoured():
    # The worker's clock 5 s ahead of the canceller's: its run seems to begin after the
    # request it never honours.
    job = services.enqueue("wf.provision_undo", {})
    services.start(job.pk, "w1")
    services.request_cancel(job, "ops", "stop")
    asked = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=asked, started_at=asked + timedelta(seconds=5))
    finding = stuck.check(fresh(job))
    assert finding is not None and finding.reason == stuck.CANCEL_UNHONOURED
    assert Job.objects.filter(stuck.stuck_q(stuck.CANCEL_UNHONOURED), pk=job.pk).exists()


# A run for its undos that no worker takes ---------------------------------------------------


def _cancel_run_pending(kind_paused: bool = True) -> Job:
    job = _woken()
    if kind_paused:
        services.pause_kind("wf.provision_undo", "ops")
    services.request_cancel(job, "ops", "stop")
    job = fresh(job)
    assert job.status == Status.QUEUED and job.cancel_requested_at is not None
    return job


def test_force_cancel_ends_a_job_whose_undo_run_no_worker_takes_without_its_undos():
    job = _cancel_run_pending()
    assert drain() == 0
    services.request_cancel(job, "ops", "again")  # the first request stands
    assert fresh(job).status == Status.QUEUED
    services.force_cancel(job, "ops", "kind paused for the week")
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == DONE
    last = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert last is not None and (last.transition, last.from_status) == ("cancel", "queued")
    assert last.reason == (
        "kind paused for the week; cancelled without the run its cancel was queued for "
        "(a workflow's undos not run)"
    )


def test_force_cancel_still_refuses_a_queued_job_with_no_cancel_run_pending():
    job = services.enqueue("wf.provision_undo", {})
    with pytest.raises(InvalidTransition):
        services.force_cancel(job, "ops")
    assert fresh(job).status == Status.QUEUED


def test_the_command_line_says_what_a_cancel_and_a_cancel_now_did():
    job = _woken()
    out = StringIO()
    call_command("jobstate", "cancel", str(job.pk), stdout=out)
    assert out.getvalue().strip() == (
        f"cancel requested for {job.pk}: queued for one run of its undos, then it ends cancelled "
        "(cancel --now ends it without them)"
    )
    out = StringIO()
    call_command("jobstate", "cancel", str(job.pk), "--now", stdout=out)
    assert out.getvalue().strip() == f"cancelled {job.pk}, its undos not run"
    assert fresh(job).status == Status.CANCELLED


def test_the_stuck_page_cancel_remedy_ends_a_job_whose_undo_run_nobody_serves(admin_client: Any):
    job = _cancel_run_pending(kind_paused=False)
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(hours=1))
    finding = stuck.check(fresh(job))  # no job of its kind ended lately: unserved
    assert finding is not None and finding.remedy == stuck.START_WORKER
    response = admin_client.post(
        reverse("admin:jobstate_job_stuck_remedy"), {"job": str(job.pk), "operation": "cancel"}
    )
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said == [f"Job {short(job.pk)} cancelled, its undos not run."]
    assert fresh(job).status == Status.CANCELLED and labels(job) == DONE


def test_an_operator_requeue_of_a_hung_undo_run_keeps_it_a_run_for_its_undos():
    job = _woken()
    services.request_cancel(job, "ops", "stop")
    services.start(job.pk, "w2")  # its undo run begins; the worker then hangs
    services.requeue(job, "ops", "stuck, requeue")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    expected = {"recovery": "cancel", "operator": True}
    assert row is not None and (row.transition, row.metadata) == ("requeue", expected)
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_a_bulk_requeue_from_the_admin_list_of_a_hung_undo_run_keeps_its_mark(admin_client: Any):
    # The list's "Requeue selected jobs…" goes through services.requeue, as the job page's.
    job = _woken()
    services.request_cancel(job, "ops", "stop")
    services.start(job.pk, "w2")  # its undo run begins; the worker then hangs
    data = {
        "action": "requeue_selected",
        "_selected_action": [str(job.pk)],
        "index": 0,
        "confirm": "yes",
        "reason": "stuck after the crash",
    }
    response = admin_client.post(reverse("admin:jobstate_job_changelist"), data)
    assert response.status_code == 302
    assert next(str(m) for m in get_messages(response.wsgi_request)).startswith("Requeued 1 job.")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    expected = {"recovery": "cancel", "operator": True}
    assert row is not None and (row.transition, row.reason, row.metadata) == (
        "requeue",
        "stuck after the crash",
        expected,
    )
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_an_operator_requeue_of_a_run_that_met_its_cancel_and_hung_in_its_undos_keeps_them():
    # The cancel came while a step ran: that same run undoes, its history marking it before
    # the first undo. A requeue of it when it hung wrote a plain row; the next begin cancelled
    # the job unstarted, its undos never run, while the admin said "requeued" (review).
    crash = {"crash_at": "undo:reserve", "crash_once": True}
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work", **crash})
    with pytest.raises(SimulatedCrash):
        run_next("w1")  # hung in reserve's undo, as far as the operator can tell
    assert recovery_action(job.pk) == "cancel"  # its own mark, not the workflow's answer
    assert _cancel_long_past(job.pk) == (None, False)  # not "cancel not honoured"
    services.requeue(job, "ops", "stuck, requeue")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and row.metadata == {"recovery": "cancel", "operator": True}
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, "crash:undo:reserve", *UNDONE]
    assert JobEvent.objects.filter(job_id=job.pk, transition="compensate_cancel").count() == 1


def test_an_operator_requeue_of_a_step_deaf_to_its_cancel_gives_the_next_run_the_undos():
    # Hung in a step that never saw its cancel: no undo began, so no mark. The requeue asks
    # the workflow (hooks.cancelling): its undos are left, so the next run runs them.
    def deaf(self: Any, ctx: Any) -> None:
        services.request_cancel(ctx.job.pk, "ops", "stop")
        raise SimulatedCrash("hung in work")

    job = services.enqueue("wf.provision_undo", {})
    with mock.patch.object(ProvisionUndo, "work", deaf), pytest.raises(SimulatedCrash):
        run_next("w1")
    assert recovery_action(job.pk) is None
    finding, listed = _cancel_long_past(job.pk)
    assert finding is not None and finding.reason == stuck.CANCEL_UNHONOURED and listed
    services.requeue(job, "ops", "stuck, requeue")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and row.metadata == {"recovery": "cancel", "operator": True}
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == ["provision", "reserve", *UNDONE]


def test_an_earlier_wait_runs_mark_does_not_keep_a_later_hung_undo_run_from_its_undos():
    # A reaper requeue of an earlier run marked "wait" (a worker lost as the workflow went to
    # wait for its children) stays the newest such row: the waiting run is woken, not
    # requeued. The requeue of a later run that met its cancel and hung in its undos read
    # that "wait", wrote a plain row, and the next begin cancelled the job, undos not run.
    crash = {"crash_at": "undo:reserve", "crash_once": True}
    job = services.enqueue("wf.provision_undo", {"cancel_in": "work", **crash})
    earlier = timezone.now() - timedelta(minutes=5)
    JobEvent.objects.create(
        job_id=job.pk,
        from_status=Status.PROCESSING,
        to_status=Status.QUEUED,
        transition="requeue",
        actor_label="reaper",
        reason="lease expired",
        metadata={"recovery": "wait"},
        created_at=earlier,
    )
    with pytest.raises(SimulatedCrash):
        run_next("w1")
    services.requeue(job, "ops", "stuck, requeue")
    row = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert row is not None and row.metadata == {"recovery": "cancel", "operator": True}
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, "crash:undo:reserve", *UNDONE]


def test_operator_requeues_are_not_counted_as_the_reapers_recovery_runs():
    from jobstate.workflows import recovery

    job = _woken()
    services.request_cancel(job, "ops", "stop")
    for _ in range(recovery.RECOVERY_RUNS):
        services.start(job.pk, "w2")
        services.requeue(job, "ops", "stuck, requeue")
        Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    # Its worker dies in the next run: the reaper's first recovery run, not its fourth
    # (which would fail the job "lost again after 3 recovery runs").
    services.start(job.pk, "w3")
    report = services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    assert report.requeued == [job.pk]
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain(kinds=["wf.provision_undo"]) == 1
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == [*DONE, *UNDONE]


def test_force_cancel_ends_a_queued_job_with_a_cancel_request_and_no_cancel_run():
    # A plain workflow: processing, its cancel requested, then requeued by an operator.
    job = services.enqueue("wf.provision", {})
    services.start(job.pk, "w1")
    services.request_cancel(job, "ops", "stop")
    services.requeue(job, "ops", "stuck")
    assert fresh(job).status == Status.QUEUED and fresh(job).cancel_requested_at is not None
    services.force_cancel(job, "ops", "give up")
    assert fresh(job).status == Status.CANCELLED
    last = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert last is not None and (last.transition, last.reason) == ("cancel", "give up")


def _plain_requeued_with_a_cancel() -> Job:
    job = services.enqueue("wf.provision", {})
    services.start(job.pk, "w1")
    services.request_cancel(job, "ops", "stop")
    return services.requeue(job, "ops", "stuck")


def test_the_admin_force_cancels_a_queued_plain_job_with_a_leftover_cancel(admin_client: Any):
    job = _plain_requeued_with_a_cancel()
    url = reverse("admin:jobstate_job_transition", args=[job.pk, "force_cancel"])
    response = admin_client.post(url, {"reason": "give up"})
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["Job cancelled."]
    assert fresh(job).status == Status.CANCELLED


def test_the_stuck_page_cancel_remedy_ends_a_queued_plain_job_with_a_leftover_cancel(admin_client: Any):
    job = _plain_requeued_with_a_cancel()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(hours=1))
    assert stuck.check(fresh(job)) is not None
    response = admin_client.post(
        reverse("admin:jobstate_job_stuck_remedy"), {"job": str(job.pk), "operation": "cancel"}
    )
    assert [str(m) for m in get_messages(response.wsgi_request)] == [f"Job {short(job.pk)} cancelled."]
    assert fresh(job).status == Status.CANCELLED
    out = StringIO()
    job = _plain_requeued_with_a_cancel()
    call_command("jobstate", "cancel", str(job.pk), "--now", stdout=out)
    assert out.getvalue().strip() == f"cancelled {job.pk}"
