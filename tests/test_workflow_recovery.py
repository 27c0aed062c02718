"""Workflows whose worker is lost at awkward moments: on the last attempt, while
compensating, while serving; stop requests on queued workflows; how steps left
in progress show in a finished job."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

import jobstate
from jobstate import registry, services, stuck
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.worker import runner
from jobstate.worker.runner import drain, run_job, run_next
from jobstate.workflows import recovery, state
from tests.models import Effect
from tests.workflow_jobs import SimulatedCrash, effect

pytestmark = pytest.mark.django_db(transaction=True)
SAGA_ERROR = "step 'ship' failed: NonRetryable: address does not exist"


def labels(job: Job) -> list[str]:
    return list(Effect.objects.filter(job_id=job.pk).order_by("id").values_list("label", flat=True))


def statuses(job: Job) -> dict[str, str]:
    return dict(JobStep.objects.filter(job_id=job.pk).values_list("name", "status"))


def reap() -> services.ReapReport:
    """The reaper, once a dead worker's lease has run out."""
    return services.requeue_expired(now=timezone.now() + timedelta(hours=1))


def crash(job: Job) -> None:
    """Run ``job`` until its worker "dies" (a SimulatedCrash escapes the runner)."""
    with pytest.raises(SimulatedCrash):
        run_job(services.start(job.pk, "w1"), "w1")


def rerun(job: Job) -> str:
    return run_job(services.start(job.pk, "w2"), "w2")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


# A. A worker lost on the last attempt -------------------------------------------


def test_a_worker_lost_on_the_last_attempt_still_compensates():
    job = services.enqueue("wf.saga", {"crash_at": "ship"}, max_attempts=1)
    crash(job)  # book, charge and notify completed; the worker dies in ship
    assert reap().requeued == [job.pk]
    job = fresh(job)
    assert job.status == Status.QUEUED and (job.attempts, job.max_attempts) == (0, 1)
    ship = JobStep.objects.get(job_id=job.pk, name="ship")
    assert ship.status == "failed" and ship.error_message == "worker lost"
    requeue = JobEvent.objects.get(job_id=job.pk, transition="requeue")
    assert requeue.actor_label == "system:reaper" and requeue.metadata["recovery"] == "compensate"
    assert requeue.reason.endswith("last attempt: compensating")

    assert rerun(job) == "failed"
    job = fresh(job)
    assert job.status == Status.FAILED and (job.attempts, job.max_attempts) == (1, 1)
    assert job.error_type == "WorkflowFailed"
    assert job.error_message == "step 'ship' failed: worker lost; undone: charge, book"
    assert labels(job) == ["book", "charge", "notify", "undo:charge:C1", "undo:book:B1"]
    assert (job.current_step, job.progress_message) == ("ship", "step 'ship' failed; undone: charge, book")
    assert statuses(job) == {"book": "undone", "charge": "undone", "notify": "completed", "ship": "failed"}
    assert JobEvent.objects.filter(job_id=job.pk, transition="claim").count() == 2  # one attempt, two runs


def test_a_worker_lost_after_the_last_step_gets_its_job_completed():
    class Done(jobstate.Workflow):
        @jobstate.step(undo="undo_one")
        def one(self, ctx: Any) -> int:
            effect(ctx, "one")
            return 1

        @jobstate.step()
        def two(self, ctx: Any, one: int) -> int:
            effect(ctx, "two")
            return one + 1

        def undo_one(self, ctx: Any, output: int) -> None:
            effect(ctx, "undo:one")

        def result(self, outputs: dict[str, Any]) -> Any:
            if not Effect.objects.filter(label="died").exists():
                Effect.objects.create(job_id=job.pk, label="died")
                raise SimulatedCrash("after the last step")
            return outputs["two"]

    jobstate.workflow("t.done", max_attempts=1)(Done)
    try:
        job = services.enqueue("t.done", {})
        crash(job)
        assert reap().requeued == [job.pk]
        assert JobEvent.objects.get(job_id=job.pk, transition="requeue").metadata["recovery"] == "finish"
        assert rerun(job) == "completed"
    finally:
        registry.unregister("t.done")
    job = fresh(job)
    assert job.status == Status.COMPLETED and job.result == 2 and job.attempts == 1
    assert labels(job) == ["one", "two", "died"]  # no step ran again, nothing was undone


def test_a_step_added_by_a_deploy_while_the_worker_was_lost_is_compensated_for():
    # The reaper picked the new step, which had no row yet, to fail: JobStep.DoesNotExist
    # escaped requeue_expired at every sweep, and this job and every expired job after
    # it stayed processing.
    class V1(jobstate.Workflow):
        @jobstate.step(undo="undo_one")
        def one(self, ctx: Any) -> int:
            effect(ctx, "one")
            return 1

        def undo_one(self, ctx: Any, output: int) -> None:
            effect(ctx, "undo:one")

        def result(self, outputs: dict[str, Any]) -> Any:
            raise SimulatedCrash("after the last step")

    class V2(V1):  # the next deploy adds a step
        @jobstate.step()
        def two(self, ctx: Any, one: int) -> int:
            effect(ctx, "two")
            return one + 1

    jobstate.workflow("t.deployed", max_attempts=1)(V1)
    try:
        job = services.enqueue("t.deployed", {})
        crash(job)
        registry.unregister("t.deployed")
        jobstate.workflow("t.deployed", max_attempts=1)(V2)
        assert reap().requeued == [job.pk]
        assert statuses(job) == {"one": "completed", "two": "failed"}
        assert rerun(job) == "failed"
    finally:
        registry.unregister("t.deployed")
    job = fresh(job)
    assert job.error_message == "step 'two' failed: worker lost; undone: one"
    assert labels(job) == ["one", "undo:one"]  # the new step never ran


def test_a_reaping_that_raises_leaves_that_job_and_reaps_the_others(monkeypatch, caplog):
    first = services.enqueue("test.echo", {}, max_attempts=1)
    second = services.enqueue("test.echo", {}, max_attempts=1)
    for job in (first, second):
        services.start(job.pk, "w1")
    real = services.reaper.move

    def move(pk: Any, *args: Any, **kwargs: Any) -> Any:
        if pk == first.pk:
            raise KeyError("a hook's bug")
        return real(pk, *args, **kwargs)

    monkeypatch.setattr(services.reaper, "move", move)
    report = reap()
    assert report.errors == [first.pk] and report.failed == [second.pk]
    assert fresh(first).status == Status.PROCESSING and fresh(second).status == Status.FAILED
    assert f"Reaping expired job {first.pk} failed" in caplog.text


def test_jobs_whose_reaping_raises_do_not_hide_the_others_from_a_limited_sweep(monkeypatch, caplog):
    """The oldest expired jobs keep failing to reap (a hook's bug): a sweep limited to
    two moves still reaches the job behind them."""
    jobs = [services.enqueue("test.echo", {}, max_attempts=1) for _ in range(3)]
    for job in jobs:
        services.start(job.pk, "w1")
    base = timezone.now()
    for offset, job in enumerate(jobs):  # expiry order: jobs[0], jobs[1], jobs[2]
        Job.objects.filter(pk=job.pk).update(lease_expires_at=base + timedelta(seconds=offset))
    broken = {jobs[0].pk, jobs[1].pk}
    real = services.reaper.move

    def move(pk: Any, *args: Any, **kwargs: Any) -> Any:
        if pk in broken:
            raise KeyError("a hook's bug")
        return real(pk, *args, **kwargs)

    monkeypatch.setattr(services.reaper, "move", move)
    report = services.requeue_expired(now=base + timedelta(hours=1), limit=2)
    assert report.failed == [jobs[2].pk] and set(report.errors) == broken
    assert fresh(jobs[2]).status == Status.FAILED


def test_waits_for_a_held_parent_row_count_against_the_sweeps_limit(monkeypatch):
    """Each waits REAP_PARENT_WAIT_MS: paging past them would let one sweep (the
    pusher's, or the admin's request) run without bound."""
    jobs = [services.enqueue("test.echo", {}, max_attempts=1) for _ in range(3)]
    for job in jobs:
        services.start(job.pk, "w1")
    monkeypatch.setattr(services.reaper, "_lock_parent_briefly", lambda pk: False)
    report = services.requeue_expired(now=timezone.now() + timedelta(hours=1), limit=2)
    assert len(report.skipped) == 2 and report.total == 0


def test_jobs_whose_own_row_is_held_do_not_hide_the_others_from_a_limited_sweep(monkeypatch):
    """A held row costs no wait (SKIP LOCKED): such jobs, oldest first, took the
    sweep's places and hid the job behind them."""
    jobs = [services.enqueue("test.echo", {}, max_attempts=1) for _ in range(3)]
    for job in jobs:
        services.start(job.pk, "w1")
    base = timezone.now()
    for offset, job in enumerate(jobs):
        Job.objects.filter(pk=job.pk).update(lease_expires_at=base + timedelta(seconds=offset))
    held = {jobs[0].pk, jobs[1].pk}
    real = services.reaper._lock_unless_held
    monkeypatch.setattr(
        services.reaper, "_lock_unless_held", lambda pk, token: real(pk, token) if pk not in held else False
    )
    report = services.requeue_expired(now=base + timedelta(hours=1), limit=2)
    assert set(report.skipped) == held and report.failed == [jobs[2].pk]


def test_a_worker_lost_on_the_last_attempt_with_nothing_to_undo_fails_as_before():
    job = services.enqueue("wf.five", {"crash_at": "s3"}, max_attempts=1)
    crash(job)
    assert reap().failed == [job.pk]
    job = fresh(job)
    assert job.status == Status.FAILED and job.error_message == "worker lost"
    # G: the step the worker was in shows as interrupted, not running.
    steps = {s["name"]: s for s in state(job)["steps"]}
    assert steps["s3"]["status"] == "interrupted" and steps["s3"]["stored_status"] == "running"
    assert steps["s2"]["status"] == "completed" and "stored_status" not in steps["s2"]


def test_a_worker_lost_on_the_last_attempt_after_its_fan_out_committed_waits_for_the_children(
    monkeypatch,
):
    def dies(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("between the fan-out's commit and the suspend")

    job = services.enqueue("wf.fan", {"n": 3}, max_attempts=1)
    with monkeypatch.context() as patched:
        patched.setattr(services, "suspend", dies)
        crash(job)  # split started its 3 children and waits; the worker dies before giving the job back
    assert statuses(job) == {"split": "waiting", "merge": "pending"}
    assert reap().requeued == [job.pk]
    job = fresh(job)
    assert job.status == Status.QUEUED and (job.attempts, job.max_attempts) == (0, 1)
    requeue = JobEvent.objects.get(job_id=job.pk, transition="requeue")
    assert requeue.metadata["recovery"] == "wait"
    children = Job.objects.filter(parent=job)
    assert set(children.values_list("status", flat=True)) == {Status.QUEUED}  # not cancelled

    assert rerun(job) == "suspended"  # the recovery run waits for the children, starting none
    assert fresh(job).status == Status.WAITING and children.count() == 3
    assert drain() == 4  # the 3 children, then the parent, woken by the last
    job = fresh(job)
    assert job.status == Status.COMPLETED and (job.attempts, job.max_attempts) == (1, 1)
    assert job.result == {"total": 3, "sum": 0 + 1 + 4, "value": {"spawned": 3}}
    assert labels(job) == ["split", "merge"]  # split's body ran once: its children started once
    assert children.count() == 3


def test_a_worker_lost_after_its_fan_out_committed_on_an_earlier_attempt_spends_no_attempt(monkeypatch):
    """As on the last attempt: the run's outcome was to wait (its children started); it
    was requeued with its attempt spent, one more than the work done deserved."""

    def dies(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("between the fan-out's commit and the suspend")

    job = services.enqueue("wf.fan", {"n": 3}, max_attempts=2)
    with monkeypatch.context() as patched:
        patched.setattr(services, "suspend", dies)
        crash(job)
    assert statuses(job) == {"split": "waiting", "merge": "pending"}
    assert reap().requeued == [job.pk]
    job = fresh(job)
    assert job.status == Status.QUEUED and job.attempts == 0
    requeue = JobEvent.objects.get(job_id=job.pk, transition="requeue")
    assert requeue.metadata["recovery"] == "wait" and "last attempt" not in requeue.reason
    assert rerun(job) == "suspended"  # waits for the children, starting none
    assert drain() == 4
    job = fresh(job)
    assert job.status == Status.COMPLETED and job.attempts == 1
    assert labels(job) == ["split", "merge"] and Job.objects.filter(parent=job).count() == 3


def test_wait_recoveries_on_earlier_attempts_are_bounded_then_spend_attempts(monkeypatch):
    """A run that keeps dying before it gives the job back: after RECOVERY_RUNS free
    runs, attempts are spent as for any lost worker, then the job fails."""

    def dies(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("before the suspend, every time")

    monkeypatch.setattr(services, "suspend", dies)
    job = services.enqueue("wf.fan", {"n": 2}, max_attempts=2)
    crash(job)
    for _ in range(recovery.RECOVERY_RUNS):
        assert reap().requeued == [job.pk] and fresh(job).attempts == 0
        crash(job)
    assert reap().requeued == [job.pk]  # attempts left: the usual rule, the attempt spent
    assert fresh(job).attempts == 1
    crash(job)
    assert reap().failed == [job.pk]
    job = fresh(job)
    assert job.status == Status.FAILED and job.attempts == 2
    assert job.error_message.startswith(f"worker lost again after {recovery.RECOVERY_RUNS} recovery runs")
    assert labels(job) == ["split"] and Job.objects.filter(parent=job).count() == 2


def test_a_cancel_stops_a_run_after_a_wait_recovery_before_it_begins():
    # The "wait" recovery requeue stayed the job's last requeue (the run suspends and is
    # woken, not requeued), so each later run was taken for an undo run that a cancel does
    # not stop: begun, its attempt charged, the handler called.
    def dies(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash("between the fan-out's commit and the suspend")

    job = services.enqueue("wf.fan", {"n": 2}, max_attempts=1)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(services, "suspend", dies)
        crash(job)
    assert reap().requeued == [job.pk]
    assert rerun(job) == "suspended"
    children = Job.objects.filter(parent=job)
    assert drain(kinds=[children.first().kind]) == 2  # the children end; the last wakes the parent
    assert fresh(job).status == Status.QUEUED
    (claimed,) = services.claim("w3")  # reserved, not begun
    services.request_cancel(job, "ops", "not needed")
    assert run_job(claimed, "w3") == "cancelled"
    job = fresh(job)
    assert job.status == Status.CANCELLED and job.attempts == 0  # the handler never ran
    assert statuses(job)["merge"] == "pending"


def test_recovery_runs_are_bounded():
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_always": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)  # ship fails for good; charge is undone, then the worker dies in book's undo
    for _ in range(recovery.RECOVERY_RUNS):
        assert reap().requeued == [job.pk]
        assert fresh(job).attempts == 0
        crash(job)  # every recovery run dies in the same undo
    assert reap().failed == [job.pk]
    job = fresh(job)
    assert job.status == Status.FAILED and job.attempts == 1 and job.error_type == "WorkerLost"
    assert job.error_message == (
        f"worker lost again after {recovery.RECOVERY_RUNS} recovery runs; {SAGA_ERROR}; undone: charge"
    )
    assert labels(job).count("undo:charge:C1") == 1 and labels(job).count("ship") == 1


# B. A worker lost during (or just before) compensation ----------------------------


def test_a_crash_before_the_undos_never_runs_the_failed_step_again():
    params = {"non_retryable": True, "crash_at": "undo:charge", "crash_once": True}
    job = services.enqueue("wf.saga", params)  # max_attempts=2: an attempt is left
    crash(job)  # ship failed for good; the worker dies in the first undo
    ship = JobStep.objects.get(job_id=job.pk, name="ship")
    assert ship.status == "failed" and ship.detail["compensating"]["error"].startswith("NonRetryable")
    assert reap().requeued == [job.pk]
    assert rerun(job) == "failed"
    job = fresh(job)
    assert job.status == Status.FAILED and job.attempts == 1
    assert job.error_message == f"{SAGA_ERROR}; undone: charge, book"
    assert labels(job) == [
        "book",
        "charge",
        "notify",
        "ship",  # once: the resumed run only compensates
        "crash:undo:charge",
        "undo:charge:C1",
        "undo:book:B1",
    ]


def test_compensation_resumes_after_a_crash_between_two_undos():
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_once": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)
    assert statuses(job) == {"book": "completed", "charge": "undone", "notify": "completed", "ship": "failed"}
    assert reap().requeued == [job.pk]
    assert rerun(job) == "failed"
    job = fresh(job)
    assert job.error_message == f"{SAGA_ERROR}; undone: charge, book"
    assert labels(job).count("undo:charge:C1") == 1  # not undone twice
    assert statuses(job) == {"book": "undone", "charge": "undone", "notify": "completed", "ship": "failed"}
    undone = JobEvent.objects.filter(job_id=job.pk, transition="step_undone")
    assert [e.metadata["step"] for e in undone] == ["charge", "book"]


def test_compensation_that_began_outlives_a_cancel_request():
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_once": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)  # compensating: charge undone, the worker dies in book's undo
    services.request_cancel(job, "ops", "give up")
    assert reap().requeued == [job.pk]  # not cancelled: the undos are not finished
    rerun(job)
    job = fresh(job)
    assert statuses(job)["book"] == "undone" and labels(job).count("undo:book:B1") == 1
    # The runner ends an attempt that fails under a cancel request ``cancelled``.
    assert job.status == Status.CANCELLED and job.attempts == 1


def test_a_cluster_runs_the_recovery_of_undos_despite_the_cancel_request():
    # As a cluster takes it: reserved by a claim, begun by the worker process.
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_once": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)
    services.request_cancel(job, "ops", "give up")
    assert reap().requeued == [job.pk]
    (claimed,) = services.claim("w2", now=timezone.now() + timedelta(hours=2))
    assert run_job(claimed, "w2") == "cancelled"  # not cancelled unstarted: the undos ran first
    job = fresh(job)
    assert statuses(job)["book"] == "undone" and labels(job).count("undo:book:B1") == 1
    assert job.status == Status.CANCELLED


def test_a_recovery_run_reserved_by_a_cluster_that_stopped_is_not_cancelled():
    # The reaper cancelled a reserved job with a cancel request, recovery run or not:
    # the undos left were never run (book stayed completed, the job cancelled).
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_once": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)
    services.request_cancel(job, "ops", "give up")
    assert reap().requeued == [job.pk]
    later = timezone.now() + timedelta(hours=2)
    assert services.claim("w2", now=later)  # reserved; the cluster stops before beginning it
    assert services.requeue_expired(now=later + timedelta(hours=1)).requeued == [job.pk]
    (claimed,) = services.claim("w3", now=later + timedelta(hours=2))
    assert run_job(claimed, "w3") == "cancelled"  # the undos ran first
    job = fresh(job)
    assert statuses(job)["book"] == "undone" and labels(job).count("undo:book:B1") == 1
    assert job.status == Status.CANCELLED


def test_a_recovery_run_whose_handler_could_not_be_started_is_not_cancelled(monkeypatch):
    # Its set-up failed (requeued with that error, the attempt refunded): that requeue
    # was taken for the run's own, so a later cancel request cancelled the run before
    # the undos left (book stayed completed). A hand-back keeps what the run was.
    params = {"non_retryable": True, "crash_at": "undo:book", "crash_once": True}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    crash(job)
    assert reap().requeued == [job.pk]
    later = timezone.now() + timedelta(hours=2)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no file descriptors left")

    with monkeypatch.context() as patched:
        patched.setattr(runner, "Slot", broken)
        (claimed,) = services.claim("w2", now=later)
        with pytest.raises(OSError):
            run_job(claimed, "w2")
    assert fresh(job).status == Status.QUEUED
    (claimed,) = services.claim("w3", now=later + timedelta(hours=2))
    services.request_cancel(job, "ops", "give up")  # reserved, not begun
    assert run_job(claimed, "w3") == "cancelled"  # the undos ran first
    job = fresh(job)
    assert statuses(job)["book"] == "undone" and labels(job).count("undo:book:B1") == 1


def test_a_run_that_is_not_compensating_stops_at_once_on_a_cancel():
    job = services.enqueue("wf.saga", {})
    (claimed,) = services.claim("w1")
    services.request_cancel(job, "ops", "not needed")
    assert run_job(claimed, "w1") == "cancelled"
    assert fresh(job).status == Status.CANCELLED and labels(job) == []


def test_a_retry_does_not_inherit_the_old_jobs_compensation():
    from jobstate.workflows import retry_from

    job = services.enqueue("wf.saga", {"non_retryable": True, "undo_fails": "book"})
    drain()  # charge undone; book's undo failed, so book stays completed
    again = retry_from(job, "charge", actor="ops", reason="try again")
    book = JobStep.objects.get(job_id=again.pk, name="book")
    assert book.status == "completed" and book.detail == {"copied_from": str(job.pk)}
    drain()
    again = fresh(again)
    assert again.status == Status.FAILED
    # book's undo failed in the old job; for this one it is tried again.
    assert labels(again) == ["charge", "notify", "ship", "undo:charge:C1", "undo:book:B1"]


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1})
def test_an_undo_cut_off_by_the_timeout_is_recorded_and_the_others_still_run():
    class Slow(jobstate.Workflow):
        @jobstate.step(undo="undo_a")
        def a(self, ctx: Any) -> str:
            return "A"

        @jobstate.step(undo="undo_b")
        def b(self, ctx: Any) -> str:
            return "B"

        @jobstate.step()
        def c(self, ctx: Any) -> None:
            raise jobstate.NonRetryable("no")

        def undo_a(self, ctx: Any, output: str) -> None:
            undone.append(output)

        def undo_b(self, ctx: Any, output: str) -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.02)

    undone: list[str] = []
    jobstate.workflow("t.slow_undo", timeout=0.5, max_attempts=1)(Slow)
    try:
        job = services.enqueue("t.slow_undo", {})
        drain()
    finally:
        registry.unregister("t.slow_undo")
    job = fresh(job)
    assert job.status == Status.FAILED and undone == ["A"]
    assert job.error_message == (
        "step 'c' failed: NonRetryable: no; undone: a; undo failed: b (interrupted (timeout))"
    )


# A cancel requested while a failure's undos run -----------------------------------------

QUICK_GRACE = {"HEARTBEAT_SECONDS": 0.2, "CANCEL_GRACE_SECONDS": 0.3, "INTERRUPT_GRACE_SECONDS": 0.5}


def _cancelled_while_undoing(undo_on_cancel: bool, params: dict[str, Any]) -> Job:
    """Run a workflow whose last step fails for good; the first undo (b's) requests the
    job's cancel, as a user would meanwhile, and a's undo then beats and checks for a
    cancel as a long undo would. ``undo_seconds``: each undo takes that long."""

    class CancelledWhileUndoing(jobstate.Workflow):
        @jobstate.step(undo="undo_a")
        def a(self, ctx: Any) -> str:
            return "A"

        @jobstate.step(undo="undo_b")
        def b(self, ctx: Any) -> str:
            return "B"

        @jobstate.step()
        def c(self, ctx: Any) -> None:
            raise jobstate.NonRetryable("no")

        def undo_b(self, ctx: Any, output: str) -> None:
            services.request_cancel(ctx.job.pk, "ops", "give up")
            _pause(ctx)
            effect(ctx, "undo:b")

        def undo_a(self, ctx: Any, output: str) -> None:
            ctx.heartbeat()
            ctx.check_cancelled()
            _pause(ctx)
            if ctx.parameters.get("look_stuck"):
                _look_stuck(ctx)
            effect(ctx, f"undo:a (cancel requested: {ctx.cancel_requested})")

    kind = "t.cancelled_while_undoing"
    jobstate.workflow(kind, max_attempts=1, timeout=30, undo_on_cancel=undo_on_cancel)(CancelledWhileUndoing)
    try:
        job = services.enqueue(kind, params)
        assert drain() == 1
    finally:
        registry.unregister(kind)
    return fresh(job)


def _look_stuck(ctx: Any) -> None:
    """As the stuck page would see the job once its cancel is long past (the undos still run)."""
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=ctx.job.pk).update(cancel_requested_at=long_ago)
    job = Job.objects.get(pk=ctx.job.pk)
    listed = Job.objects.filter(stuck.any_stuck_q(), pk=job.pk).exists()
    effect(ctx, f"stuck: {stuck.check(job)}, listed: {listed}")


def _pause(ctx: Any) -> None:
    end = time.monotonic() + float(ctx.parameters.get("undo_seconds", 0))
    while time.monotonic() < end:  # short sleeps: an interrupt can break them
        time.sleep(0.01)


@pytest.mark.parametrize("undo_on_cancel", [False, True])
def test_a_failures_undo_may_beat_and_check_for_a_cancel_requested_meanwhile(undo_on_cancel):
    job = _cancelled_while_undoing(undo_on_cancel, {})
    assert statuses(job) == {"a": "undone", "b": "undone", "c": "failed"}
    assert labels(job) == ["undo:b", "undo:a (cancel requested: True)"]
    # The compensation finished; the cancel requested meanwhile decides the outcome.
    assert job.status == Status.CANCELLED
    last = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert last is not None and last.transition == "cancel"
    assert last.reason == (
        "cancel requested; the attempt ended with WorkflowFailed: step 'c' failed: NonRetryable: no; "
        "undone: b, a"
    )
    assert not JobEvent.objects.filter(job_id=job.pk, transition="step_undo_failed").exists()


@pytest.mark.parametrize("undo_on_cancel", [False, True])
def test_a_failures_undos_running_past_a_cancel_are_not_a_cancel_not_honoured(undo_on_cancel):
    # The failure's undos honour the cancel (the job ends cancelled once they are done),
    # in the run that failed: its step's failure marks the run, as a recovery run's requeue.
    job = _cancelled_while_undoing(undo_on_cancel, {"look_stuck": True})
    assert labels(job) == ["undo:b", "stuck: None, listed: False", "undo:a (cancel requested: True)"]
    assert job.status == Status.CANCELLED


def test_an_operator_requeue_of_a_failures_undos_hung_after_a_cancel_keeps_them_a_run():
    class HungWhileUndoing(jobstate.Workflow):
        @jobstate.step(undo="undo_a")
        def a(self, ctx: Any) -> str:
            return "A"

        @jobstate.step()
        def b(self, ctx: Any) -> None:
            raise jobstate.NonRetryable("no")

        def undo_a(self, ctx: Any, output: str) -> None:
            if not Effect.objects.filter(job_id=ctx.job.pk, label="hung").exists():
                effect(ctx, "hung")
                services.request_cancel(ctx.job.pk, "ops", "give up")
                raise SimulatedCrash("hung in its undo")  # the operator finds it hung
            effect(ctx, "undo:a")

    kind = "t.hung_while_undoing"
    jobstate.workflow(kind, max_attempts=1)(HungWhileUndoing)
    try:
        job = services.enqueue(kind, {})
        crash(job)
        services.requeue(job, "ops", "hung")
        requeue = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
        assert requeue is not None and requeue.metadata == {"recovery": "compensate", "operator": True}
        assert rerun(job) == "cancelled"  # not cancelled unstarted: its undos finish first
    finally:
        registry.unregister(kind)
    job = fresh(job)
    assert job.status == Status.CANCELLED and labels(job) == ["hung", "undo:a"]
    assert statuses(job) == {"a": "undone", "b": "failed"}


@override_settings(JOBSTATE=QUICK_GRACE)
@pytest.mark.parametrize("undo_on_cancel", [False, True])
def test_a_failures_undos_are_not_cut_off_by_the_grace_of_a_cancel_requested_meanwhile(undo_on_cancel):
    # Together they take longer than both graces: the job's timeout bounds them instead.
    job = _cancelled_while_undoing(undo_on_cancel, {"undo_seconds": 0.6})
    assert statuses(job) == {"a": "undone", "b": "undone", "c": "failed"}
    assert labels(job) == ["undo:b", "undo:a (cancel requested: True)"]
    assert job.status == Status.CANCELLED
    last = JobEvent.objects.filter(job_id=job.pk).order_by("id").last()
    assert last is not None and last.transition == "cancel"  # not "stopped after the cancel grace period"
    assert last.reason.startswith("cancel requested; the attempt ended with WorkflowFailed")


# C. Stop requests on queued jobs ------------------------------------------------------


def test_stop_on_a_queued_parent_that_never_served_cancels_it_and_its_children():
    parent = services.enqueue("wf.fan", {"n": 3})
    run_next("w1")  # split started 3 children; the parent waits
    assert fresh(parent).status == Status.WAITING
    services.request_stop(parent, "ops", "not needed")
    assert fresh(parent).status == Status.CANCELLED
    children = Job.objects.filter(parent=parent)
    assert children.count() == 3 and set(children.values_list("status", flat=True)) == {Status.CANCELLED}
    assert JobEvent.objects.get(job_id=parent.pk, transition="cancel").reason == "not needed"
    # G: the step that was waiting shows as interrupted.
    split = state(parent.pk)["steps"][0]
    assert split["status"] == "interrupted" and split["stored_status"] == "waiting"


def test_stop_on_a_served_job_waiting_for_its_rescue_ends_it_completed(user):
    job = services.enqueue("wf.service", {"crash_at": "serve"}, max_attempts=2)
    crash(job)  # the worker dies while serving
    assert reap().requeued == [job.pk]
    assert fresh(job).status == Status.QUEUED and statuses(job)["serve"] == "serving"
    services.request_stop(job, services.Actor.api(user), "done for today")
    job = fresh(job)
    assert job.status == Status.QUEUED and job.stop_requested_at is not None
    stop = JobEvent.objects.get(job_id=job.pk, transition="request_stop")
    assert (stop.from_status, stop.to_status, stop.actor_id) == ("queued", "queued", user.pk)
    services.request_stop(job, "api", "again")  # stored once
    assert JobEvent.objects.filter(job_id=job.pk, transition="request_stop").count() == 1

    assert rerun(job) == "completed"
    job = fresh(job)
    assert job.status == Status.COMPLETED and job.result == {"stopped_on_request": True}
    assert labels(job) == ["prepare", "serving", "serving", "stopping", "collect"]


def test_stop_on_a_job_that_never_ran_cancels_it():
    job = services.enqueue("wf.service", {})
    services.request_stop(job, "ops")
    job = fresh(job)
    assert job.status == Status.CANCELLED and job.stop_requested_at is None
    assert JobEvent.objects.get(job_id=job.pk, transition="cancel").reason == "stopped before it served"
