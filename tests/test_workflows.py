"""Workflows in-process: steps, resume after a crash, checkpoints, compensation,
operators, state JSON, service-style steps. Fan-out has its own module."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job, run_next
from jobstate.workflows import retry_from, skip_step, state, steps
from tests.models import Effect
from tests.workflow_jobs import SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)


def labels(job: Job, prefix: str = "") -> list[str]:
    qs = Effect.objects.filter(job_id=job.pk, label__startswith=prefix).order_by("id")
    return list(qs.values_list("label", flat=True))


def step_rows(job: Job) -> dict[str, JobStep]:
    return {s.name: s for s in JobStep.objects.filter(job_id=job.pk)}


def transitions(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job.pk).values_list("transition", flat=True))


def expire_leases() -> None:
    """What the reaper does once a dead worker's lease has run out."""
    report = services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    assert report.requeued


def resume(job: Job) -> str:
    """Another worker takes the requeued job (its run_after is the reaper's "now")."""
    return run_job(services.start(job.pk, "w2"), "w2")


def test_steps_run_in_order_handing_outputs_on():
    job = services.enqueue("wf.five", {})
    assert drain() == 1
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    assert job.result == {"sum": 5, "seen": ["s1", "s2", "s3", "s4"]}
    assert job.progress == 100 and job.current_step == "s5"
    rows = step_rows(job)
    assert [rows[n].output for n in ("s1", "s2", "s3", "s4")] == [1, 2, 3, 4]
    assert all(r.status == "completed" and r.attempts == 1 and r.finished_at for r in rows.values())
    assert transitions(job) == ["enqueue", "claim"] + ["step_started", "step_completed"] * 5 + ["complete"]


def test_resume_after_crash_skips_completed_steps():
    job = services.enqueue("wf.five", {"crash_at": "s3"})
    with pytest.raises(SimulatedCrash):
        drain()  # the "worker" dies in the middle of s3
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.current_step == "s3" and job.progress == 40
    assert {n: r.status for n, r in step_rows(job).items()} == {
        "s1": "completed",
        "s2": "completed",
        "s3": "running",
        "s4": "pending",
        "s5": "pending",
    }
    expire_leases()
    assert resume(job) == "completed"
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 2
    assert job.result == {"sum": 5, "seen": ["s1", "s2", "s3", "s4"]}
    assert labels(job) == [
        "s1:start",
        "s1",
        "s2:start",
        "s2",
        "s3:start",
        "s3:start",  # the crashed attempt, then the resumed one
        "s3",
        "s4:start",
        "s4",
        "s5:start",
        "s5",
    ]
    rows = step_rows(job)
    assert rows["s3"].attempts == 2 and rows["s2"].attempts == 1


def test_stale_worker_cannot_write_a_step():
    job = services.enqueue("wf.five", {"crash_at": "s2"})
    with pytest.raises(SimulatedCrash):
        drain()
    stale = Job.objects.get(pk=job.pk)
    expire_leases()
    for write in (
        lambda: steps.checkpoint(stale, stale.lease_token, "s2", 7),
        lambda: steps.complete(stale, stale.lease_token, step_rows(job)["s2"], 2, percent=40),
        lambda: steps.fail(stale, stale.lease_token, step_rows(job)["s2"], "late"),
    ):
        with pytest.raises(LeaseLost):
            write()
    row = step_rows(job)["s2"]
    assert row.status == "running" and row.cursor is None and row.output is None and row.error_message == ""


def test_batched_step_resumes_from_its_cursor():
    job = services.enqueue("wf.batch", {"n": 35, "crash_item": 23, "crash_at": "load"})
    with pytest.raises(SimulatedCrash):
        drain()
    assert step_rows(job)["load"].cursor == 20  # checkpoints every 10 items
    expire_leases()
    resume(job)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"loaded": 35}
    runs: dict[int, int] = {}
    for item in Effect.objects.filter(job_id=job.pk, label="item").values_list("item", flat=True):
        runs[item] = runs.get(item, 0) + 1
    assert sorted(runs) == list(range(35))
    assert {i for i, n in runs.items() if n == 2} == {20, 21, 22, 23}  # since the last checkpoint
    assert labels(job, "prepare") == ["prepare"] and labels(job, "report") == ["report"]
    starts = Effect.objects.filter(job_id=job.pk, label="load:start").values_list("item", flat=True)
    assert list(starts) == [None, 20]
    load = step_rows(job)["load"]
    assert load.cursor == 35 and load.attempts == 2


def test_atomic_batches_run_each_item_exactly_once():
    job = services.enqueue("wf.batch", {"n": 35, "crash_item": 23, "crash_at": "load", "atomic": True})
    with pytest.raises(SimulatedCrash):
        drain()
    # The batch 20..29 was rolled back with its checkpoint.
    assert step_rows(job)["load"].cursor == 20
    assert Effect.objects.filter(job_id=job.pk, label="item").count() == 20
    expire_leases()
    resume(job)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    items = list(Effect.objects.filter(job_id=job.pk, label="item").values_list("item", flat=True))
    assert sorted(items) == list(range(35))


def test_checkpoints_report_progress_within_the_step():
    seen: list[tuple[int, str]] = []

    class Watch(jobstate.Workflow):
        @jobstate.step()
        def first(self, ctx: Any) -> None:
            pass

        @jobstate.step(batch=5)
        def second(self, ctx: Any) -> None:
            for _ in ctx.iterate(range(20)):
                pass
            job = Job.objects.get(pk=ctx.job.pk)
            seen.append((job.progress, job.progress_message))
            ctx.progress(50, "half way by hand")
            job = Job.objects.get(pk=ctx.job.pk)
            seen.append((job.progress, job.current_step))

    jobstate.workflow("t.watch")(Watch)
    try:
        job = services.enqueue("t.watch", {})
        drain()
    finally:
        from jobstate import registry

        registry.unregister("t.watch")
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED
    assert seen == [(100, "20/20"), (75, "second")]


def test_a_resumed_step_begins_where_its_checkpoint_left_the_progress():
    begun: list[tuple[str, int | None, int]] = []  # (step, cursor, the job's progress as it begins)
    crashed: set[str] = set()  # each iterating step's worker dies once, after item 23

    class Resume(jobstate.Workflow):
        @jobstate.step()
        def first(self, ctx: Any) -> None:
            pass

        def _walk(self, ctx: Any, items: Any) -> None:
            begun.append((ctx.step, ctx.cursor, Job.objects.get(pk=ctx.job.pk).progress))
            for i in ctx.iterate(items, every=10):
                if i == 23 and ctx.step not in crashed:
                    crashed.add(ctx.step)
                    raise SimulatedCrash(ctx.step)

        @jobstate.step()
        def known(self, ctx: Any) -> None:  # 50 items: the band is 25..50
            self._walk(ctx, range(50))

        @jobstate.step()
        def unknown(self, ctx: Any) -> None:  # no total: the step's progress is not known
            self._walk(ctx, iter(range(50)))

        @jobstate.step()
        def plain(self, ctx: Any) -> None:
            begun.append((ctx.step, ctx.cursor, Job.objects.get(pk=ctx.job.pk).progress))

    jobstate.workflow("t.resume", max_attempts=5, retry_backoff=0)(Resume)
    try:
        job = services.enqueue("t.resume", {})
        with pytest.raises(SimulatedCrash):
            drain()
        assert Job.objects.get(pk=job.pk).progress == 35  # 25 + 25 * 20/50 at the checkpoint
        assert step_rows(job)["known"].detail == {steps.PERCENT: 40.0}  # the step's own progress
        assert state(job)["steps"][1]["detail"] == {}  # bookkeeping, not shown
        expire_leases()
        with pytest.raises(SimulatedCrash):
            resume(job)
        assert Job.objects.get(pk=job.pk).progress_message == "20 done"
        expire_leases()
        assert resume(job) == "completed"
        retried = retry_from(job, "known", actor="ops")
        drain()
    finally:
        registry.unregister("t.resume")
    assert begun == [
        ("known", None, 25),  # a first run begins at the band's start
        ("known", 20, 35),  # resumed from its checkpoint: not back to 25
        ("unknown", None, 50),
        ("unknown", 20, 50),
        ("plain", None, 75),
        ("known", None, 25),  # an operator's retry runs the step again from its start
        ("unknown", None, 50),
        ("plain", None, 75),
    ]
    assert Job.objects.get(pk=retried.pk).status == Status.COMPLETED


def test_a_step_resumed_from_its_checkpoint_says_so_and_reports_that_progress():
    """What a step reported after its last checkpoint is not where it resumes (that work
    runs again): the job shows the checkpoint's progress, and a message that says why
    it went back; it showed an empty message."""
    begun: list[tuple[int, str]] = []  # the job's (progress, message) as the step begins

    class Phases(jobstate.Workflow):
        @jobstate.step()
        def first(self, ctx: Any) -> None:
            pass

        @jobstate.step()
        def second(self, ctx: Any) -> None:  # the band is 50..100
            begun.append(Job.objects.values_list("progress", "progress_message").get(pk=ctx.job.pk))
            if ctx.cursor is None:
                ctx.checkpoint("loaded", percent=40, message="loaded")
                ctx.progress(80, "almost transformed")
                raise SimulatedCrash("second")

    jobstate.workflow("t.phases", max_attempts=2, retry_backoff=0)(Phases)
    try:
        job = services.enqueue("t.phases", {})
        with pytest.raises(SimulatedCrash):
            drain()
        assert Job.objects.values_list("progress", "progress_message").get(pk=job.pk) == (
            90,
            "almost transformed",
        )
        expire_leases()
        assert resume(job) == "completed"
    finally:
        registry.unregister("t.phases")
    assert begun == [(50, ""), (70, "resumed from its last checkpoint")]  # 50 + 50 * 40 %


def test_compensation_undoes_completed_steps_in_reverse_order():
    job = services.enqueue("wf.saga", {})
    drain()  # attempt 1 fails in ship and is retried; attempt 2 fails for good
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 2
    assert labels(job) == [
        "book",
        "charge",
        "notify",
        "ship",  # attempt 1: no undo, it will be retried
        "ship",
        "undo:charge:C1",
        "undo:book:B1",
    ]
    assert job.error_type == "WorkflowFailed"
    assert job.error_message == "step 'ship' failed: RuntimeError: carrier down; undone: charge, book"
    # The job names the step that failed, not the last one undone ("undid book").
    assert job.current_step == "ship" and job.progress == 75
    assert job.progress_message == "step 'ship' failed; undone: charge, book"
    assert {n: r.status for n, r in step_rows(job).items()} == {
        "book": "undone",
        "charge": "undone",
        "notify": "completed",
        "ship": "failed",
    }
    events = list(JobEvent.objects.filter(job_id=job.pk, transition="step_undone"))
    assert [e.metadata["step"] for e in events] == ["charge", "book"]
    assert all(e.actor_label.startswith("worker:") and "ship" in e.reason for e in events)
    assert state(job)["undone"] == ["book", "charge"]
    assert transitions(job)[-1] == "fail"


def test_non_retryable_failure_compensates_at_once():
    job = services.enqueue("wf.saga", {"non_retryable": True})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1
    assert labels(job, "undo") == ["undo:charge:C1", "undo:book:B1"]
    assert "address does not exist" in job.error_message and "undone: charge, book" in job.error_message


def test_a_failing_undo_is_recorded_and_the_others_still_run():
    job = services.enqueue("wf.saga", {"non_retryable": True, "undo_fails": "book"})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert job.error_message.endswith("undone: charge; undo failed: book (RuntimeError: booking system down)")
    assert job.current_step == "ship"
    assert job.progress_message == (
        "step 'ship' failed; undone: charge; undo failed: book (RuntimeError: booking system down)"
    )
    rows = step_rows(job)
    assert rows["charge"].status == "undone" and rows["book"].status == "completed"
    assert "booking system down" in rows["book"].detail["undo_error"]
    assert JobEvent.objects.filter(job_id=job.pk, transition="step_undo_failed").count() == 1


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1})
def test_timeout_on_the_last_attempt_compensates(temp_handler):
    from jobstate import registry

    class Slow(jobstate.Workflow):
        @jobstate.step(undo="undo_reserve")
        def reserve(self, ctx: Any) -> str:
            return "R1"

        @jobstate.step()
        def crawl(self, ctx: Any) -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.02)

        def undo_reserve(self, ctx: Any, output: str) -> None:
            undone.append(output)

    undone: list[str] = []
    jobstate.workflow("t.slow_wf", timeout=0.5, max_attempts=1)(Slow)
    try:
        job = services.enqueue("t.slow_wf", {})
        drain()
    finally:
        registry.unregister("t.slow_wf")
    job.refresh_from_db()
    assert job.status == Status.FAILED and undone == ["R1"]
    assert job.error_message == "step 'crawl' failed: timed out; undone: reserve"
    assert step_rows(job)["crawl"].error_message == "timed out"


def test_retry_from_a_step_reuses_earlier_outputs(user):
    job = services.enqueue("wf.fixable", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and step_rows(job)["two"].status == "failed"
    Effect.objects.create(job_id=job.pk, label="fixed")
    new = retry_from(job, "two", actor=services.Actor.admin(user), reason="fixed the input")
    assert new.retry_of_id == job.pk and new.status == Status.QUEUED
    assert {n: r.status for n, r in step_rows(new).items()} == {
        "one": "completed",
        "two": "pending",
        "three": "pending",
    }
    event = JobEvent.objects.get(job_id=new.pk, transition="retry_from")
    assert event.actor_id == user.pk and event.actor_label == "admin" and event.reason == "fixed the input"
    assert event.metadata == {"retry_of": str(job.pk), "from_step": "two", "reused": ["one"], "skipped": []}
    drain()
    new.refresh_from_db()
    assert new.status == Status.COMPLETED and new.result == {"one": 1, "two": 2}
    assert labels(new) == ["two", "three"]  # "one" did not run again
    job.refresh_from_db()
    assert job.status == Status.FAILED  # terminal jobs stay terminal


def test_retry_from_by_default_after_every_step_completed_runs_none_again():
    # The steps all completed, then result() raised: "where it stopped" is after the
    # last step; the retry used to start from the first and charge again.
    calls: list[str] = []

    class Charges(jobstate.Workflow):
        @jobstate.step()
        def charge(self, ctx: Any) -> int:
            Effect.objects.create(job_id=ctx.job.pk, label="charged")
            return 1

        def result(self, outputs: dict[str, Any]) -> Any:
            calls.append("result")
            if len(calls) == 1:
                raise RuntimeError("summary failed")
            return outputs

    jobstate.workflow("t.charges", max_attempts=1)(Charges)
    try:
        job = services.enqueue("t.charges", {})
        drain()
        assert Job.objects.get(pk=job.pk).status == Status.FAILED
        again = retry_from(job, actor="ops")
        assert JobStep.objects.get(job_id=again.pk, name="charge").status == "completed"  # copied
        with pytest.raises(ValidationError, match="Every step completed"):
            retry_from(job, actor="ops", skip=["charge"])
        drain()
    finally:
        registry.unregister("t.charges")
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and calls == ["result", "result"]
    assert Effect.objects.filter(label="charged").count() == 1
    # A completed job runs again from its first step, as before.
    jobstate.workflow("t.charges", max_attempts=1)(Charges)
    try:
        third = retry_from(again, actor="ops")
        drain()
    finally:
        registry.unregister("t.charges")
    assert Job.objects.get(pk=third.pk).status == Status.COMPLETED
    assert Effect.objects.filter(label="charged").count() == 2


def test_a_skip_reason_is_stored_as_text():
    job = services.enqueue("wf.fixable", {})
    drain()
    again = retry_from(job, "two", skip=["two"], actor="ops", reason="known\x00bad")
    assert JobStep.objects.get(job_id=again.pk, name="two").detail["skip_reason"] == "known\ufffdbad"


def test_retry_from_where_it_stopped_by_default_and_refusals():
    job = services.enqueue("wf.fixable", {})
    drain()
    with pytest.raises(ValidationError, match="did not complete"):
        retry_from(job, "three")
    with pytest.raises(ValidationError, match="not a step"):
        retry_from(job, "four")
    with pytest.raises(ValidationError, match="Only steps from"):
        retry_from(job, "two", skip=["one"])
    # An unknown name was "Only steps from 'two' on can be skipped: nine", as if it came before two.
    with pytest.raises(ValidationError) as info:
        retry_from(job, "two", skip=["two", "nine", ""])
    assert info.value.message_dict == {"skip": ["'nine', '': not a step of wf.fixable (one, two, three)."]}
    # A string was taken as its characters: "'t', 'w', 'o': not a step".
    with pytest.raises(TypeError, match=r"skip is a list of step names, not a string: skip=\['two'\]"):
        retry_from(job, "two", skip="two")
    assert Job.objects.count() == 1  # refusals write nothing
    new = retry_from(job, actor="ops", reason="again")
    assert JobEvent.objects.get(job_id=new.pk, transition="retry_from").metadata["from_step"] == "two"
    with pytest.raises(InvalidTransition):
        retry_from(new, "two")  # still queued
    plain = services.enqueue("test.echo", {})
    drain()
    with pytest.raises(ValidationError, match="not a registered workflow"):
        retry_from(plain)


def test_skip_a_failed_step_on_a_retry():
    job = services.enqueue("wf.fixable", {})
    drain()
    new = retry_from(job, "two", skip=["two"], actor="ops", reason="two is optional today")
    skipped = step_rows(new)["two"]
    assert skipped.status == "skipped"
    assert skipped.detail == {"skipped_by": "ops", "skip_reason": "two is optional today"}
    drain()
    new.refresh_from_db()
    assert new.status == Status.COMPLETED and new.result == {"one": 1, "two": None}
    assert labels(new) == ["three"]


def test_skip_a_failed_step_of_a_job_waiting_for_its_retry(user):
    job = services.enqueue("wf.fixable", {}, max_attempts=2)
    run_next("w1")  # attempt 1 fails in "two"; the retry waits for its backoff
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.run_after > timezone.now()
    skip_step(job, "two", actor=user, reason="not needed")
    event = JobEvent.objects.get(job_id=job.pk, transition="skip_step")
    assert (event.actor_id, event.reason, event.metadata) == (
        user.pk,
        "not needed",
        {"step": "two", "from": "failed", "to": "skipped"},
    )
    with pytest.raises(steps.StepStateError):
        skip_step(job, "one", actor=user)  # completed steps cannot be skipped
    run_job(services.start(job, "w2"), "w2")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"one": 1, "two": None}
    assert labels(job) == ["one", "two", "three"]
    with pytest.raises(InvalidTransition):
        skip_step(job, "three", actor=user)  # finished: use retry_from


def test_mark_partial_lets_the_workflow_finish_partial(temp_handler):
    from jobstate import registry

    class Lenient(jobstate.Workflow):
        @jobstate.step()
        def fetch(self, ctx: Any) -> list[int]:
            ctx.mark_partial("2 of 5 sources unreachable")
            return [1, 2, 3]

        @jobstate.step()
        def total(self, ctx: Any, fetch: list[int]) -> int:
            return sum(fetch)

    jobstate.workflow("t.lenient")(Lenient)
    try:
        job = services.enqueue("t.lenient", {})
        drain()
    finally:
        registry.unregister("t.lenient")
    job.refresh_from_db()
    assert job.status == Status.PARTIAL and job.result == 6
    assert job.error_message == "fetch: 2 of 5 sources unreachable"


def test_serving_and_partial_notes_with_a_nul_character_are_stored_cleaned():
    # Other text a step reports (ctx.progress) has its NUL characters replaced; these
    # raised a ValidationError inside the step, which then failed and was retried.
    class Noted(jobstate.Workflow):
        @jobstate.step()
        def one(self, ctx: Any) -> int:
            ctx.serving("up\x00now")
            ctx.mark_partial("half\x00done")
            return 1

    jobstate.workflow("t.noted", max_attempts=1)(Noted)
    try:
        job = services.enqueue("t.noted", {})
        drain()
    finally:
        registry.unregister("t.noted")
    job.refresh_from_db()
    assert job.status == Status.PARTIAL and job.result == 1
    assert job.error_message == "one: half\ufffddone"
    serve = JobEvent.objects.get(job_id=job.pk, transition="step_serving")
    assert serve.metadata["message"] == "up\ufffdnow"


def test_stop_request_ends_a_serving_job_completed(user):
    job = services.enqueue("wf.service", {})
    seen: dict[str, Any] = {}

    def operator() -> None:
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if JobStep.objects.filter(job_id=job.pk, name="serve", status="serving").exists():
                    break
                time.sleep(0.02)
            seen["state"] = state(job.pk)
            services.request_stop(job.pk, services.Actor.api(user), "done for today")
        finally:
            connection.close()

    thread = threading.Thread(target=operator)
    thread.start()
    drain()
    thread.join(20)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"stopped_on_request": True}
    assert job.stop_requested_at is not None
    assert seen["state"]["serving"] is True and seen["state"]["current_step"] == "serve"
    assert seen["state"]["progress_message"] == "serving on http://127.0.0.1:9/"
    assert labels(job) == ["prepare", "serving", "stopping", "collect"]
    stop = JobEvent.objects.get(job_id=job.pk, transition="request_stop")
    assert stop.actor_id == user.pk and stop.reason == "done for today"
    assert transitions(job).index("step_serving") < transitions(job).index("request_stop")
    assert step_rows(job)["serve"].status == "completed"


def test_state_json_of_a_workflow_that_has_not_run():
    job = services.enqueue("wf.fixable", {})
    data = state(job)
    assert data["workflow"] is True and data["status"] == "queued"
    assert [(s["name"], s["position"], s["status"]) for s in data["steps"]] == [
        ("one", 0, "pending"),
        ("two", 1, "pending"),
        ("three", 2, "pending"),
    ]
    plain = services.enqueue("test.echo", {})
    assert state(plain)["workflow"] is False and state(plain)["steps"] == []
    import json

    json.dumps(data)  # JSON-ready


def test_definition_errors_are_caught_when_the_class_is_defined():
    with pytest.raises(TypeError, match="names no earlier step"):

        class Bad(jobstate.Workflow):
            @jobstate.step()
            def a(self, ctx: Any, b: Any) -> None: ...

            @jobstate.step()
            def b(self, ctx: Any) -> None: ...

    with pytest.raises(TypeError, match="undo method 'nope'"):

        class NoUndo(jobstate.Workflow):
            @jobstate.step(undo="nope")
            def a(self, ctx: Any) -> None: ...

    with pytest.raises(TypeError, match="unique"):

        class Twice(jobstate.Workflow):
            @jobstate.step("x")
            def a(self, ctx: Any) -> None: ...

            @jobstate.step("x")
            def b(self, ctx: Any) -> None: ...

    # A step method named as a Workflow attribute: "steps" was replaced by the step
    # list (every run failed calling it), "result" was called again as the result.
    for taken in ("steps", "result", "kind", "step_named"):
        with pytest.raises(TypeError, match=f"'{taken}' is a Workflow attribute"):
            type("Taken", (jobstate.Workflow,), {taken: jobstate.step()(lambda self, ctx: None)})
    with pytest.raises(TypeError, match="undo method 'result' is a Workflow attribute"):

        class UndoResult(jobstate.Workflow):
            @jobstate.step(undo="result")
            def a(self, ctx: Any) -> None: ...

    class Empty(jobstate.Workflow):
        pass

    with pytest.raises(TypeError, match="declares no @step"):
        jobstate.workflow("t.empty")(Empty)
    with pytest.raises(ValueError):
        jobstate.step(on_child_failure="explode")


def test_an_async_step_undo_or_result_is_refused_when_the_class_is_defined():
    # A step's coroutine was stored as its output: every run failed with an output that
    # cannot be stored; an async undo was recorded "undone" without its body running.
    with pytest.raises(TypeError, match=r"Step\.a: .*async function.*async_to_sync"):

        class Step(jobstate.Workflow):
            @jobstate.step()
            async def a(self, ctx: Any) -> None: ...

    with pytest.raises(TypeError, match=r"Undo\.a: undo method 'back' is an async function"):

        class Undo(jobstate.Workflow):
            @jobstate.step(undo="back")
            def a(self, ctx: Any) -> None: ...

            async def back(self, ctx: Any, output: Any) -> None: ...

    with pytest.raises(TypeError, match=r"Result\.result: .*async function"):

        class Result(jobstate.Workflow):
            @jobstate.step()
            def a(self, ctx: Any) -> None: ...

            async def result(self, outputs: dict[str, Any]) -> Any: ...  # type: ignore[override]


def test_a_step_that_raises_is_failed_with_its_error_then_retried():
    job = services.enqueue("wf.fixable", {}, max_attempts=2)
    run_next("w1")
    row = step_rows(job)["two"]
    assert row.status == "failed" and row.error_message == "RuntimeError: two is broken"
    event = JobEvent.objects.get(job_id=job.pk, transition="step_failed")
    assert event.metadata["step"] == "two" and event.metadata["attempt"] == 1
    Effect.objects.create(job_id=job.pk, label="fixed")
    run_job(services.start(job, "w2"), "w2")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    row = step_rows(job)["two"]
    assert row.status == "completed" and row.attempts == 2 and row.error_message == ""


def test_a_step_can_wait_for_a_time_without_holding_a_worker():
    from jobstate import registry
    from jobstate.exceptions import Suspend

    class Later(jobstate.Workflow):
        @jobstate.step()
        def wait(self, ctx: Any) -> str:
            if ctx.cursor is None:
                ctx.checkpoint({"asked_at": timezone.now().isoformat()})
                raise Suspend("back in an hour", until=timezone.now() + timedelta(hours=1))
            return "woke"

    jobstate.workflow("t.later")(Later)
    try:
        job = services.enqueue("t.later", {})
        assert drain() == 1
        job.refresh_from_db()
        assert job.status == Status.QUEUED and job.attempts == 0
        assert job.run_after > timezone.now() + timedelta(minutes=59)
        assert drain() == 0  # not before its time
        assert run_job(services.start(job.pk, "w2"), "w2") == "completed"
    finally:
        registry.unregister("t.later")
    job.refresh_from_db()
    assert job.result == "woke" and job.attempts == 1
    assert step_rows(job)["wait"].attempts == 2


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_suspends_after_a_cancel_request_ends_cancelled(temp_handler):
    from jobstate.exceptions import Suspend

    def handler(ctx: Any) -> None:
        services.request_cancel(ctx.job.pk, "api", "user gave up")  # arrives mid-run
        raise Suspend("poll again tomorrow", until=timezone.now() + timedelta(days=1))

    temp_handler("t.poller", handler)
    job = services.enqueue("t.poller", {})
    (claimed,) = services.claim("w1", kinds=["t.poller"])
    assert run_job(claimed, "w1") == "cancelled"
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
