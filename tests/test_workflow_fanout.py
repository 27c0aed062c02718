"""Fan-out and fan-in: a step starts child jobs, the workflow waits for them
without holding a worker, and continues once they all ended."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import ACTIVE, Status
from jobstate.worker.runner import drain, run_next
from jobstate.workflows import state
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def step(job: Job, name: str) -> JobStep:
    return JobStep.objects.get(job_id=job.pk, name=name)


def test_fan_out_of_50_children_and_fan_in():
    parent = services.enqueue("wf.fan", {"n": 50})
    assert run_next("w1") is not None  # split: starts 50 children, gives the worker back
    parent.refresh_from_db()
    assert parent.status == Status.WAITING
    assert parent.attempts == 0  # waiting spends no attempt
    assert step(parent, "split").status == "waiting"
    children = Job.objects.filter(parent=parent)
    assert children.count() == 50 and set(children.values_list("status", flat=True)) == {Status.QUEUED}
    assert set(children.values_list("owner_id", flat=True)) == {parent.owner_id}

    for _ in range(25):
        assert run_next("w2", kinds=["wf.child"]) is not None
    parent.refresh_from_db()
    # split is the first of two steps (0..50 %): half its children are done.
    assert parent.progress == 25 and parent.progress_message == "25 of 50 child jobs finished"
    live = state(parent)
    assert live["waiting_for_children"] and live["progress"] == 25.0
    assert live["children"]["by_status"] == {"completed": 25, "queued": 25}
    assert live["steps"][0]["children"]["total"] == 50
    assert parent.status == Status.WAITING  # still asleep

    assert drain() == 26  # the other 25 children, then the parent, woken by the last one
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED and parent.attempts == 1
    assert parent.result == {"total": 50, "sum": sum(i * i for i in range(50)), "value": {"spawned": 50}}
    split = step(parent, "split")
    assert split.status == "completed" and split.output["completed"] == 50 and split.output["failed"] == 0
    assert split.output["results"][7] == {"i": 7, "square": 49}
    assert Effect.objects.filter(job_id=parent.pk, label="split").count() == 1  # never re-run
    assert Effect.objects.filter(job_id=parent.pk, label="merge").count() == 1
    assert list(JobEvent.objects.filter(job_id=parent.pk).values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "step_started",
        "step_waiting",
        "suspend",  # processing -> waiting
        "wake",  # by its last child: waiting -> queued
        "claim",
        "step_completed",
        "step_started",
        "step_completed",
        "complete",
    ]


def test_a_failed_child_fails_the_parent():
    parent = services.enqueue("wf.fan", {"n": 5, "fail": [3]})
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.FAILED and parent.attempts == 1  # not retried: the child is final
    assert parent.error_type == "ChildrenFailed"
    failed = Job.objects.get(parent=parent, status=Status.FAILED)
    assert parent.error_message == (
        f"1 of 5 child jobs failed or were cancelled: {failed.pk} failed (NonRetryable: child 3 failed)"
    )
    assert step(parent, "split").status == "failed"
    assert not Effect.objects.filter(job_id=parent.pk, label="merge").exists()


def test_a_failed_fan_in_names_the_first_failed_children_and_keeps_its_summary_on_the_step():
    parent = services.enqueue("wf.fan", {"n": 8, "fail": [1, 2, 4, 6, 7]})
    drain()
    parent.refresh_from_db()
    children = list(Job.objects.filter(parent=parent).order_by("created_at", "id"))
    named = ", ".join(f"{children[i].pk} failed (NonRetryable: child {i} failed)" for i in (1, 2, 4))
    assert parent.error_message == f"5 of 8 child jobs failed or were cancelled: {named}; and 2 more"
    split = step(parent, "split")
    assert split.status == "failed" and split.error_message == f"ChildrenFailed: {parent.error_message}"
    assert split.output["failed"] == 5 and split.output["completed"] == 3
    assert split.output["jobs"] == [str(c.pk) for c in children]
    assert [f["job"] for f in split.output["failures"]] == [str(children[i].pk) for i in (1, 2, 4, 6, 7)]
    assert split.output["failures"][0] == {
        "job": str(children[1].pk),
        "status": "failed",
        "error": "child 1 failed",
        "error_type": "NonRetryable",
    }


def test_a_failed_child_makes_the_parent_partial_under_that_policy():
    parent = services.enqueue("wf.fan_partial", {"n": 5, "fail": [3]})
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.PARTIAL
    assert parent.error_message == "split: 1 of 5 child jobs did not complete"
    assert parent.result == {"total": 5, "sum": 0 + 1 + 4 + 16, "value": {"spawned": 5}}
    failures = step(parent, "split").output["failures"]
    assert len(failures) == 1 and failures[0]["status"] == "failed" and "child 3" in failures[0]["error"]


def test_cancelling_a_waiting_parent_cancels_its_children():
    parent = services.enqueue("wf.fan", {"n": 4})
    run_next("w1")
    (running,) = services.claim("w2", kinds=["wf.child"])
    services.request_cancel(parent, "api", "no longer needed")
    parent.refresh_from_db()
    assert parent.status == Status.CANCELLED
    statuses = dict(Job.objects.filter(parent=parent).values_list("pk", "status"))
    assert statuses.pop(running.pk) == Status.PROCESSING  # asked to stop: its worker ends it
    assert set(statuses.values()) == {Status.CANCELLED}
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    assert not Job.objects.filter(parent=parent, status=Status.QUEUED).exists()


def test_children_that_end_before_the_parent_suspends_still_wake_it():
    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1", kinds=["test.echo"])
    services.begin(held, held.lease_token, "w1:1")
    child = services.enqueue("test.echo", {}, parent=held)
    (c,) = services.claim("w2", kinds=["test.echo"])
    assert c.pk == child.pk
    services.complete(c, c.lease_token, {})  # the wake-up finds the parent still processing
    services.suspend(held, held.lease_token, reason="waiting for children")
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED and parent.run_after <= timezone.now()  # ready at once


def test_spawn_validates_children_before_anything_is_started():
    class Bad(jobstate.Workflow):
        @jobstate.step()
        def split(self, ctx: Any) -> None:
            ctx.spawn("wf.child", {"i": 1})
            ctx.spawn("no.such.kind", {})

    jobstate.workflow("t.badspawn", max_attempts=1)(Bad)
    try:
        parent = services.enqueue("t.badspawn", {})
        drain()
    finally:
        registry.unregister("t.badspawn")
    parent.refresh_from_db()
    assert parent.status == Status.FAILED and "no.such.kind" in parent.error_message
    assert not Job.objects.filter(parent=parent).exists()


def register_outer(kind: str, sizes: tuple[int, ...]) -> None:
    """A workflow that fans out one ``wf.fan`` per size (each a workflow with children
    of its own), then totals their sums."""

    class Outer(jobstate.Workflow):
        @jobstate.step()
        def fan(self, ctx: Any) -> None:
            for n in sizes:
                ctx.spawn("wf.fan", {"n": n})

        @jobstate.step()
        def total(self, ctx: Any, fan: dict[str, Any]) -> int:
            return sum(r["sum"] for r in fan["results"])

    jobstate.workflow(kind)(Outer)


def test_nested_workflows_wait_for_grandchildren():
    register_outer("t.outer", (2, 3))
    try:
        outer = services.enqueue("t.outer", {})
        drain()
    finally:
        registry.unregister("t.outer")
    outer.refresh_from_db()
    assert outer.status == Status.COMPLETED and outer.result == (0 + 1) + (0 + 1 + 4)
    assert not Job.objects.filter(status__in=ACTIVE).exists()


def test_a_child_workflow_waiting_for_its_own_children_is_not_counted_as_finished():
    register_outer("t.outer_live", (2, 2))
    try:
        outer = services.enqueue("t.outer_live", {})
        assert run_next("w1", kinds=["t.outer_live"]) is not None  # outer waits for 2 wf.fan
        assert run_next("w1", kinds=["wf.fan"]) is not None  # the first waits for its 2 children
        assert run_next("w1", kinds=["wf.child"]) is not None  # one of them done
    finally:
        registry.unregister("t.outer_live")
    inner = Job.objects.get(parent=outer, status=Status.WAITING)
    assert inner.progress == 25  # its split (0..50 %) is half done
    live = state(outer.pk)
    # Outer's fan (0..50 %): one child 25 % done (waiting, not finished), one not started.
    assert live["children"]["by_status"] == {"waiting": 1, "queued": 1}
    assert live["children"]["progress"] == 12.5
    assert live["progress"] == 6.2
    assert live["steps"][0]["children"]["progress"] == 12.5


def test_retry_after_the_fan_out_reuses_the_children_results():
    parent = services.enqueue("wf.fan_partial", {"n": 4, "fail": [1]})
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.PARTIAL
    from jobstate.workflows import retry_from

    again = retry_from(parent, "merge", actor="ops", reason="merge again")
    split = state(again)["steps"][0]
    assert split["status"] == "completed"
    assert split["children"] == {"total": 4, "by_status": {"completed": 3, "failed": 1}, "progress": 100.0}
    assert drain() == 1  # only the retry: no child runs again
    again.refresh_from_db()
    assert again.status == Status.PARTIAL and again.result["sum"] == 0 + 4 + 9
    assert not Job.objects.filter(parent=again).exists()
    assert Effect.objects.filter(job_id=again.pk, label="split").count() == 0


def test_children_take_no_idempotency_key():
    class Keyed(jobstate.Workflow):
        @jobstate.step()
        def split(self, ctx: Any) -> None:
            ctx.spawn("wf.child", {"i": 1}, key="k1")

    jobstate.workflow("t.keyed", max_attempts=1)(Keyed)
    try:
        parent = services.enqueue("t.keyed", {})
        drain()
    finally:
        registry.unregister("t.keyed")
    parent.refresh_from_db()
    assert parent.status == Status.FAILED and "unknown options: key" in parent.error_message
    assert not Job.objects.filter(parent=parent).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_no_lost_wake_up_when_the_last_child_ends_while_its_parent_suspends():
    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1", kinds=["test.echo"])
    services.begin(held, held.lease_token, "w1:1")
    services.enqueue("test.echo", {}, parent=held)
    (kid,) = services.claim("w2", kinds=["test.echo"])
    in_transaction, may_commit = threading.Event(), threading.Event()

    def finish_child() -> None:
        try:
            with transaction.atomic():
                services.complete(kid, kid.lease_token, {})  # the parent is still processing
                in_transaction.set()
                may_commit.wait(10)
        finally:
            connection.close()

    child = threading.Thread(target=finish_child)
    child.start()
    assert in_transaction.wait(10)
    errors: list[BaseException] = []
    sleeper = InThread(
        lambda: services.suspend(held, held.lease_token, reason="waiting for children"), errors
    )
    sleeper.wait_until_blocked()  # suspend() waits for the child's transaction
    may_commit.set()
    child.join(10)
    sleeper.join(10)
    assert errors == []
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED and parent.run_after <= timezone.now()  # woken, not asleep forever


class InThread(threading.Thread):
    """Runs ``target`` on a connection of its own; ``pid`` is its backend's."""

    def __init__(self, target: Any, errors: list[BaseException], name: str | None = None) -> None:
        super().__init__(name=name)
        self.call, self.errors = target, errors
        self.pid: int | None = None
        self.connected = threading.Event()
        self.start()
        assert self.connected.wait(10)

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.connected.set()
            self.call()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.connected.set()
            connection.close()

    def wait_until_blocked(self) -> None:
        """Until this thread's backend waits for a lock another one holds."""
        deadline = time.monotonic() + 10
        while True:
            with connection.cursor() as cursor:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s))", [self.pid])
                if cursor.fetchone()[0]:
                    return
            assert time.monotonic() < deadline, "the second transaction did not wait for the first"
            time.sleep(0.02)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_cancelling_a_waiting_parent_while_its_last_child_ends_does_not_deadlock(monkeypatch):
    # Job rows are locked parents first: the child's final transaction takes its
    # parent's row before its own, as the cancel does (parent, then children).
    # Before, the child held its own row while waiting for the parent's, and the
    # cancel the parent's while waiting for the child's: PostgreSQL aborted one.
    from jobstate.services import transitions

    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1", kinds=["test.echo"])
    services.enqueue("test.echo", {}, parent=held)
    services.suspend(held, held.lease_token)
    (kid,) = services.claim("w2", kinds=["test.echo"])
    child_written, may_go_on = threading.Event(), threading.Event()
    real_wake = transitions.wake_parent_if_done

    def wake_later(parent_id: Any, now: Any = None) -> bool:
        child_written.set()  # the child's row is written, its parent not yet woken
        may_go_on.wait(10)
        return real_wake(parent_id, now)

    monkeypatch.setattr(transitions, "wake_parent_if_done", wake_later)
    errors: list[BaseException] = []
    child = InThread(lambda: services.complete(kid, kid.lease_token, {}), errors)
    assert child_written.wait(10)
    canceller = InThread(lambda: services.request_cancel(parent, "api", "not needed"), errors)
    canceller.wait_until_blocked()
    may_go_on.set()
    child.join(15)
    canceller.join(15)
    assert errors == []
    assert Job.objects.get(pk=kid.pk).status == Status.COMPLETED
    parent.refresh_from_db()
    assert parent.status == Status.CANCELLED  # woken by its child, then cancelled
    assert list(parent.events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "suspend",
        "wake",
        "cancel",
    ]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_asking_a_running_parent_to_cancel_as_its_worker_fails_it_does_not_deadlock(monkeypatch):
    # The cancel request locks the running parent before its children, as the
    # parent's own failure does. Before, it ended the children first, then waited
    # for the parent's row, which the failing worker held while it waited for a child.
    from jobstate.services import cascade

    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1", kinds=["test.echo"])
    services.begin(held, held.lease_token, "w1:1")
    services.enqueue("test.echo", {}, parent=held)
    (kid,) = services.claim("w2", kinds=["test.echo"])
    failing = threading.Event()
    parent_locked, may_go_on = threading.Event(), threading.Event()
    real_end = cascade.end_children

    def end_later(parent_id: Any, **kwargs: Any) -> int:
        if failing.is_set() and threading.current_thread().name == "failing worker":
            parent_locked.set()  # the failing worker holds the parent's row
            may_go_on.wait(10)
        return real_end(parent_id, **kwargs)

    monkeypatch.setattr(cascade, "end_children", end_later)
    errors: list[BaseException] = []
    failing.set()
    worker = InThread(
        lambda: services.fail(held, held.lease_token, "boom", retry=False), errors, "failing worker"
    )
    assert parent_locked.wait(10)
    canceller = InThread(lambda: services.request_cancel(parent, "api", "not needed"), errors)
    canceller.wait_until_blocked()
    may_go_on.set()
    worker.join(15)
    canceller.join(15)
    # The cancel came second: the parent had failed by then, which it says (no
    # database error, no deadlock).
    assert [type(e).__name__ for e in errors] == ["InvalidTransition"]
    parent.refresh_from_db()
    assert parent.status == Status.FAILED and parent.error_message == "boom"
    kid.refresh_from_db()
    assert kid.status == Status.PROCESSING and kid.cancel_requested_at is not None  # asked by the cascade


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_the_reaper_does_not_wait_long_for_a_parent_someone_holds():
    # It locks an expired child's parent first (parents before children), waiting
    # at most about a second: a parent held longer (its handler's own transaction)
    # leaves the child for the next sweep rather than stalling every other rescue.
    from jobstate.services import reaper

    services.enqueue("test.echo", {})
    (parent,) = services.claim("w1", kinds=["test.echo"])
    services.begin(parent, parent.lease_token, "w1:1")
    services.enqueue("test.echo", {}, parent=parent)
    (kid,) = services.claim("w2", kinds=["test.echo"])
    services.begin(kid, kid.lease_token, "w2:1")
    later = timezone.now() + timedelta(minutes=5)  # the child's lease has run out by then
    holding, release = threading.Event(), threading.Event()

    def hold_parent() -> None:
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=parent.pk).values_list("pk"))
            holding.set()
            release.wait(20)

    errors: list[BaseException] = []
    holder = InThread(hold_parent, errors)
    assert holding.wait(10)
    started = time.monotonic()
    report = services.requeue_expired(later)
    waited = time.monotonic() - started
    release.set()
    holder.join(10)
    assert errors == []
    assert reaper.REAP_PARENT_WAIT_MS / 1000 <= waited < 10
    # Parent and child both expired by then: the parent (nobody holds it now that
    # the sweep ran) is requeued; the child was left for the next sweep.
    assert kid.pk in report.skipped
    again = services.requeue_expired(later)
    assert kid.pk in again.requeued
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"  # the reaper's wait bound did not stay


def test_child_jobs_of_a_step_copied_into_a_retry():
    class Count(jobstate.Workflow):
        @jobstate.step()
        def split(self, ctx: Any) -> None:
            for i in range(3):
                ctx.spawn("wf.child", {"i": i})

        @jobstate.step()
        def merge(self, ctx: Any, split: dict[str, Any]) -> dict[str, Any]:
            mine = ctx.child_jobs("split")
            return {"split": [j.parameters["i"] for j in mine], "all": ctx.child_jobs().count()}

    jobstate.workflow("t.count")(Count)
    try:
        first = services.enqueue("t.count", {})
        drain()
        from jobstate.workflows import retry_from

        again = retry_from(first, "merge", actor="ops", reason="merge again")
        drain()
    finally:
        registry.unregister("t.count")
    first.refresh_from_db()
    again.refresh_from_db()
    assert first.result == {"split": [0, 1, 2], "all": 3}
    assert again.status == Status.COMPLETED and again.result == {"split": [0, 1, 2], "all": 3}
    assert not Job.objects.filter(parent=again).exists()


def test_a_timeout_right_after_the_children_started_waits_for_them(monkeypatch):
    from jobstate.exceptions import Interrupted
    from jobstate.workflows import step_waits

    real_wait = step_waits.wait

    def wait_then_time_out(*args: Any, **kwargs: Any) -> Any:
        real_wait(*args, **kwargs)  # committed: the children exist, the step waits
        raise Interrupted("timeout")

    monkeypatch.setattr(step_waits, "wait", wait_then_time_out)
    parent = services.enqueue("wf.fan", {"n": 3})
    assert run_next("w1") is not None
    parent.refresh_from_db()
    assert parent.status == Status.WAITING and parent.attempts == 0
    assert step(parent, "split").status == "waiting"
    monkeypatch.setattr(step_waits, "wait", real_wait)
    assert drain() == 4  # the 3 children, then the parent
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED and parent.result["total"] == 3
    assert Job.objects.filter(parent=parent).count() == 3  # started once
    assert Effect.objects.filter(job_id=parent.pk, label="split").count() == 1


def test_a_retry_after_a_failed_fan_in_waits_for_the_same_children(monkeypatch):
    from jobstate.worker.runner import run_job
    from jobstate.workflows import fanout

    real_fan_in = fanout.fan_in
    calls: list[int] = []

    def flaky_fan_in(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database hiccup")
        return real_fan_in(*args, **kwargs)

    monkeypatch.setattr(fanout, "fan_in", flaky_fan_in)
    parent = services.enqueue("wf.fan", {"n": 3})  # max_attempts=2
    drain()  # split, its children, then the woken parent, whose fan-in fails (retried later)
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED and step(parent, "split").status == "failed"
    assert run_job(services.start(parent.pk, "w2"), "w2") == "completed"
    parent.refresh_from_db()
    assert parent.result["total"] == 3 and parent.attempts == 2
    assert Job.objects.filter(parent=parent).count() == 3  # not started again
    assert Effect.objects.filter(job_id=parent.pk, label="split").count() == 1
    split = step(parent, "split")
    assert split.status == "completed" and split.attempts == 2
    resumed = JobEvent.objects.filter(job_id=parent.pk, transition="step_waiting").last()
    assert resumed.metadata == {
        "step": "split",
        "from": "failed",
        "to": "waiting",
        "children": 3,
        "resumed": True,
    }


def test_a_child_retried_by_an_operator_counts_by_its_retry():
    """An operator retries a failed child (after fixing its cause) while the parent
    still waits: the parent waits for the retry too and fans in its outcome."""
    parent = services.enqueue("wf.fan", {"n": 3, "fail": [1]})
    run_next("w1")  # split: starts three children
    first, failing, last = Job.objects.filter(parent=parent).order_by("created_at", "id")
    assert run_next("w2", kinds=["wf.child"]).pk == first.pk
    assert run_next("w2", kinds=["wf.child"]).pk == failing.pk
    failing.refresh_from_db()
    assert failing.status == Status.FAILED
    Job.objects.filter(pk=failing.pk).update(parameters={"i": 1})  # the cause, fixed
    again = services.retry(failing, "ops", "fixed")
    assert again.parent_id == parent.pk
    drain()  # the last child, the retry, then the parent
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED, (parent.error_type, parent.error_message)
    split = step(parent, "split")
    assert split.output["completed"] == 3 and split.output["failed"] == 0
    assert split.output["jobs"] == [str(first.pk), str(again.pk), str(last.pk)]
    assert split.output["retried"] == {str(failing.pk): str(again.pk)}


def test_a_partial_fan_in_is_fanned_in_again_after_its_failed_child_was_retried(monkeypatch):
    """The fan-in noted "1 of 3 child jobs did not complete", then its run failed; the
    operator retried the failed child, which completed: the step fanned in all three
    completed, yet the workflow ended partial with the old note."""
    from jobstate.worker.runner import run_job

    _fan_in_fails_once(monkeypatch)
    parent = services.enqueue("wf.fan_partial", {"n": 3, "fail": [1]})  # max_attempts=2
    drain()  # split, its children, then the woken parent: its fan-in notes partial, then fails
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED and step(parent, "split").detail["fan_in_partial"]
    failing = Job.objects.get(parent=parent, status=Status.FAILED)
    Job.objects.filter(pk=failing.pk).update(parameters={"i": 1})  # the cause, fixed
    again = services.retry(failing, "ops", "fixed")
    assert drain(kinds=["wf.child"]) == 1
    assert run_job(services.start(parent.pk, "w2"), "w2") == "completed"
    parent.refresh_from_db()
    assert (parent.status, parent.error_message) == (Status.COMPLETED, "")
    split = step(parent, "split")
    assert split.output["completed"] == 3 and split.output["retried"] == {str(failing.pk): str(again.pk)}
    assert "partial" not in split.detail and "fan_in_partial" not in split.detail


def test_a_step_waiting_again_for_its_children_keeps_the_progress_they_made(monkeypatch):
    """A run that waits again for the children an earlier run started (its fan-in
    failed) shows the share of them that finished, as the waiting parent did; it
    went back to the start of the step's share (33 % -> 0 %) until the fan-in ended."""
    from jobstate.worker.runner import run_job
    from jobstate.workflows import fanout

    real_fan_in = fanout.fan_in
    seen: list[tuple[int, str]] = []  # the parent's progress as each fan-in begins

    def watched_fan_in(run: Any, *args: Any) -> Any:
        seen.append(Job.objects.values_list("progress", "progress_message").get(pk=run.job.pk))
        return real_fan_in(run, *args)

    monkeypatch.setattr(fanout, "fan_in", watched_fan_in)
    _fan_in_fails_once(monkeypatch)
    parent = services.enqueue("wf.fan_partial", {"n": 3, "fail": [1]})  # max_attempts=2
    drain()  # split, its children, then the woken parent: its fan-in fails
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED
    failing = Job.objects.get(parent=parent, status=Status.FAILED)
    Job.objects.filter(pk=failing.pk).update(parameters={"i": 1})  # the cause, fixed
    services.retry(failing, "ops", "fixed")
    assert run_job(services.start(parent.pk, "w2"), "w2") == "suspended"  # waits for the retry
    assert drain() == 2  # the retry, then the parent
    parent.refresh_from_db()
    assert (parent.status, parent.progress) == (Status.COMPLETED, 100)
    assert seen == [
        (33, "2 of 3 child jobs finished"),  # woken: 2 of 3 (split is 0..50 %) when the last one began
        (33, "2 of 3 child jobs finished"),  # waiting again: the retried child runs
        (33, "2 of 3 child jobs finished"),
    ]


def _fan_in_fails_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``steps.complete`` of step split raises: its run fails after the fan-in."""
    from jobstate.workflows import steps

    real_complete = steps.complete
    calls: list[str] = []

    def flaky_complete(job: Job, token: Any, row: JobStep, *args: Any, **kwargs: Any) -> None:
        calls.append(row.name)
        if calls == ["split"]:
            raise RuntimeError("database hiccup")
        real_complete(job, token, row, *args, **kwargs)

    monkeypatch.setattr(steps, "complete", flaky_complete)


def test_a_fan_out_step_keeps_its_own_partial_note_next_to_its_fan_ins():
    """The step body's ``ctx.mark_partial`` and the fan-in's note are two notes: the
    fan-in overwrote the body's (the workflow's error named only the children)."""
    parent = services.enqueue("wf.fan_partial", {"n": 3, "fail": [1], "mark_partial": "1 source skipped"})
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.PARTIAL
    assert parent.error_message == "split: 1 source skipped; split: 1 of 3 child jobs did not complete"
    detail = step(parent, "split").detail
    assert detail["partial"] == "1 source skipped"
    assert detail["fan_in_partial"] == "1 of 3 child jobs did not complete"
    assert state(parent)["steps"][0]["detail"]["fan_in_partial"] == "1 of 3 child jobs did not complete"


def test_a_fan_in_that_finds_every_child_completed_keeps_the_bodys_partial_note(monkeypatch):
    """The body marked the step partial; its first fan-in counted a child out, then the
    run failed; the retried child completed: the second fan-in dropped the body's note
    with its own, and the workflow ended completed."""
    from jobstate.worker.runner import run_job

    _fan_in_fails_once(monkeypatch)
    parent = services.enqueue("wf.fan_partial", {"n": 3, "fail": [1], "mark_partial": "1 source skipped"})
    drain()  # split, its children, then the woken parent: its fan-in notes partial, then fails
    parent.refresh_from_db()
    assert parent.status == Status.QUEUED
    failing = Job.objects.get(parent=parent, status=Status.FAILED)
    Job.objects.filter(pk=failing.pk).update(parameters={"i": 1})  # the cause, fixed
    services.retry(failing, "ops", "fixed")
    assert drain(kinds=["wf.child"]) == 1
    assert run_job(services.start(parent.pk, "w2"), "w2") == "partial"
    parent.refresh_from_db()
    assert (parent.status, parent.error_message) == (Status.PARTIAL, "split: 1 source skipped")
    detail = step(parent, "split").detail
    assert detail["partial"] == "1 source skipped" and "fan_in_partial" not in detail


def test_a_retry_of_a_retried_child_counts_and_a_foreign_retry_does_not():
    parent = services.enqueue("wf.fan", {"n": 2, "fail": [0]})
    run_next("w1")
    failing, other = Job.objects.filter(parent=parent).order_by("created_at", "id")
    assert run_next("w2", kinds=["wf.child"]).pk == failing.pk
    second = services.retry(failing, "ops")  # fails again (same parameters)
    assert {run_next("w2", kinds=["wf.child"]).pk for _ in range(2)} == {other.pk, second.pk}
    second.refresh_from_db()
    parent.refresh_from_db()
    assert second.status == Status.FAILED and parent.status == Status.QUEUED  # woken: no child active
    Job.objects.filter(pk=second.pk).update(parameters={"i": 0})
    third = services.retry(second, "ops")  # before the woken parent fans in: it waits again
    # A retry under no parent (as another tool might make), newer than ``third``, is
    # not this workflow's.
    Job.objects.create(
        kind="wf.child",
        parameters={"i": 0},
        retry_of=second,
        status=Status.COMPLETED,
        finished_at=timezone.now(),
    )
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED, (parent.error_type, parent.error_message)
    assert step(parent, "split").output["retried"] == {str(failing.pk): str(third.pk)}
    assert step(parent, "split").output["jobs"] == [str(third.pk), str(other.pk)]


@pytest.mark.parametrize(
    "options",
    [{"priority": "high"}, {"max_attempts": 0}, {"run_after": "tomorrow"}, {"parameters_too": 1}],
)
def test_bad_child_options_fail_the_workflow_at_the_spawn_call_once(options):
    """Bad options are a programming error: the step stops at the spawn() call, no
    later line runs, and the workflow fails at once instead of running the step's
    body again on each attempt."""

    class BadOptions(jobstate.Workflow):
        @jobstate.step()
        def split(self, ctx: Any) -> None:
            Effect.objects.create(job_id=ctx.job.pk, label="before")
            ctx.spawn("wf.child", {"i": 1}, **options)
            Effect.objects.create(job_id=ctx.job.pk, label="after")

    jobstate.workflow("t.badoptions", max_attempts=3)(BadOptions)
    try:
        parent = services.enqueue("t.badoptions", {})
        drain()
    finally:
        registry.unregister("t.badoptions")
    parent.refresh_from_db()
    assert parent.status == Status.FAILED and parent.attempts == 1, parent.error_message
    assert list(Effect.objects.filter(job_id=parent.pk).values_list("label", flat=True)) == ["before"]
    assert next(iter(options)) in parent.error_message
    assert not Job.objects.filter(parent=parent).exists()


def test_state_counts_a_retried_child_by_its_retry():
    """state(parent), as its fan-in, counts a failed child an operator retried while the
    parent waits by that retry: its live progress and the step's children summary
    agree with the parent's stored progress instead of counting the failure as done."""
    parent = services.enqueue("wf.fan", {"n": 3, "fail": [1]})
    run_next("w1")  # split: starts three children
    first, failing, last = Job.objects.filter(parent=parent).order_by("created_at", "id")
    assert run_next("w2", kinds=["wf.child"]).pk == first.pk
    assert run_next("w2", kinds=["wf.child"]).pk == failing.pk
    again = services.retry(failing, "ops", "fixed")
    assert run_next("w2", kinds=["wf.child"]).pk == last.pk  # the retry is still queued
    parent.refresh_from_db()
    assert parent.status == Status.WAITING and parent.progress == 33  # 2 of 3 (split is 0..50 %)
    live = state(parent)
    split = live["steps"][0]
    assert split["children"] == {"total": 3, "by_status": {"completed": 2, "queued": 1}, "progress": 66.7}
    assert int(live["progress"]) == parent.progress  # 33.4: it ran ahead at 50
    assert live["children"]["by_status"] == {"completed": 2, "failed": 1, "queued": 1}  # every child
    assert again.parent_id == parent.pk
