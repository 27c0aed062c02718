"""Workflows at the edges: an interrupt (the timeout's, or a database error) landing
inside a run's own bookkeeping, next to a commit; a partial result that cannot be
stored; a failure while a cancel is pending. (From a review: each test failed before.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import OperationalError

import jobstate
from jobstate import registry, services
from jobstate.exceptions import Interrupted, NonRetryable, Partial
from jobstate.models import Job, JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain
from jobstate.workflows import items, step_undos
from jobstate.workflows import steps as wf_steps
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saga():
    """Register a two-step workflow (a, b; each with an undo) under a kind; returns
    the list its undos append to."""
    kinds: list[str] = []

    def make(kind: str, *, b_raises: BaseException | None = None) -> list[str]:
        undone: list[str] = []

        class Saga(jobstate.Workflow):
            @jobstate.step(undo="undo_a")
            def a(self, ctx: Any) -> str:
                return "A1"

            @jobstate.step(undo="undo_b")
            def b(self, ctx: Any, a: str) -> str:
                if b_raises is not None:
                    raise b_raises
                return "B1"

            def undo_a(self, ctx: Any, output: str) -> None:
                undone.append(output)

            def undo_b(self, ctx: Any, output: str) -> None:
                undone.append(output)

        jobstate.workflow(kind, max_attempts=1, retry_backoff=0)(Saga)
        kinds.append(kind)
        return undone

    yield make
    for kind in kinds:
        registry.unregister(kind)


def statuses(job: Job) -> dict[str, str]:
    return dict(JobStep.objects.filter(job_id=job.pk).values_list("name", "status"))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (Interrupted("timeout"), "step 'b' failed: timed out; undone: a"),
        (
            OperationalError("database is locked"),
            "step 'b' failed: OperationalError: database is locked; undone: a",
        ),
    ],
    ids=["timeout", "database-error"],
)
def test_a_failure_inside_a_steps_begin_on_the_last_attempt_compensates(saga, monkeypatch, error, expected):
    # steps.fail refused the step, still pending: StepStateError replaced the error
    # and no undo ran.
    undone = saga("t.edge_begin")
    real = wf_steps.begin

    def begin(job: Any, token: Any, row: Any, *, percent: float) -> Any:
        if row.name == "b":
            raise error  # as if it came inside begin's transaction, rolled back
        return real(job, token, row, percent=percent)

    monkeypatch.setattr(wf_steps, "begin", begin)
    job = services.enqueue("t.edge_begin", {})
    drain()
    job.refresh_from_db()
    assert (job.status, job.error_type, job.error_message) == (Status.FAILED, "WorkflowFailed", expected)
    assert undone == ["A1"]
    assert statuses(job) == {"a": "undone", "b": "failed"}


def test_a_timeout_right_after_a_step_completed_on_the_last_attempt_compensates(saga, monkeypatch):
    undone = saga("t.edge_after")
    real = wf_steps.complete

    def complete(job: Any, token: Any, row: Any, output: Any, *, percent: float) -> None:
        real(job, token, row, output, percent=percent)
        if row.name == "a":
            raise Interrupted("timeout")  # right after the commit

    monkeypatch.setattr(wf_steps, "complete", complete)
    job = services.enqueue("t.edge_after", {})
    drain()
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.FAILED, "WorkflowFailed"), job.error_message
    assert job.error_message == "step 'b' failed: timed out; undone: a"
    assert undone == ["A1"]
    assert statuses(job) == {"a": "undone", "b": "failed"}


@pytest.mark.parametrize("committed", [False, True], ids=["before-the-commit", "after-the-commit"])
def test_a_timeout_inside_a_steps_failure_on_the_last_attempt_still_compensates(saga, monkeypatch, committed):
    # The interrupt escaped the run: the job failed "timed out" with its step left
    # running and no undo, or marked compensating with its undos never run.
    undone = saga("t.edge_fail", b_raises=RuntimeError("b broke"))
    real = wf_steps.fail
    cut: list[bool] = []

    def fail(*args: Any, **kwargs: Any) -> bool:
        if not cut:
            cut.append(True)
            if committed:
                real(*args, **kwargs)
            raise Interrupted("timeout")
        return real(*args, **kwargs)

    monkeypatch.setattr(wf_steps, "fail", fail)
    job = services.enqueue("t.edge_fail", {})
    drain()
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.FAILED, "WorkflowFailed"), job.error_message
    assert job.error_message == "step 'b' failed: RuntimeError: b broke; undone: a"
    assert undone == ["A1"]
    assert statuses(job) == {"a": "undone", "b": "failed"}


def test_a_partial_result_that_cannot_be_stored_fails_the_step_for_good_and_compensates(saga):
    # json_value raised inside the Partial handler: the step stayed running, the
    # attempt was retried as a ValidationError, and no undo ran on the last one.
    undone = saga("t.edge_partial", b_raises=Partial("half done", result={1, 2}))
    job = services.enqueue("t.edge_partial", {})
    drain()
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.FAILED, "WorkflowFailed"), job.error_message
    assert job.error_message.startswith("step 'b' failed: step 'b' returned a partial result that cannot")
    assert undone == ["A1"]
    assert statuses(job) == {"a": "undone", "b": "failed"}


def test_an_output_that_cannot_be_stored_fails_the_step_for_good(saga):
    # Retried before (its effects again, for the same output) while attempts remained.
    calls: list[str] = []

    class Unstorable(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> Any:
            calls.append("a")
            return {1, 2}

    jobstate.workflow("t.edge_output", max_attempts=3, retry_backoff=0)(Unstorable)
    try:
        job = services.enqueue("t.edge_output", {})
        drain()
    finally:
        registry.unregister("t.edge_output")
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1 and calls == ["a"]
    assert "step 'a' returned an output that cannot be stored" in job.error_message


def test_a_step_output_over_max_result_bytes_fails_the_step_for_good(saga, settings):
    # As a job's result: one the database refuses for its size was retried as a crash.
    settings.JOBSTATE = {"MAX_RESULT_BYTES": 50}
    calls: list[str] = []

    class Big(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> Any:
            calls.append("a")
            return "y" * 60

    jobstate.workflow("t.edge_big_output", max_attempts=3, retry_backoff=0)(Big)
    try:
        job = services.enqueue("t.edge_big_output", {})
        drain()
    finally:
        registry.unregister("t.edge_big_output")
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1 and calls == ["a"]
    assert "step 'a' returned an output that cannot be stored" in job.error_message
    assert "over MAX_RESULT_BYTES (50)" in job.error_message


def test_a_fan_out_step_whose_output_cannot_be_stored_fails_for_good_starting_no_child():
    # Retried before (its body again, for the same output) while attempts remained.
    calls: list[str] = []

    class Unstorable(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> Any:
            calls.append("a")
            ctx.spawn("wf.child", {"i": 1})
            return {1, 2}

    jobstate.workflow("t.edge_fan_output", max_attempts=3, retry_backoff=0)(Unstorable)
    try:
        job = services.enqueue("t.edge_fan_output", {})
        drain()
    finally:
        registry.unregister("t.edge_fan_output")
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1 and calls == ["a"]
    assert "step 'a' returned an output that cannot be stored" in job.error_message
    assert not Job.objects.filter(parent=job).exists()


def test_an_interrupt_right_after_an_undo_neither_repeats_it_nor_skips_the_others(monkeypatch):
    calls: list[str] = []

    class Three(jobstate.Workflow):
        @jobstate.step(undo="undo_a")
        def a(self, ctx: Any) -> str:
            return "A1"

        @jobstate.step(undo="undo_b")
        def b(self, ctx: Any) -> str:
            return "B1"

        @jobstate.step()
        def c(self, ctx: Any) -> None:
            raise RuntimeError("carrier down")

        def undo_a(self, ctx: Any, output: str) -> None:
            calls.append(output)

        def undo_b(self, ctx: Any, output: str) -> None:
            calls.append(output)

    jobstate.workflow("t.edge_undo", max_attempts=1, retry_backoff=0)(Three)
    real = step_undos.undone
    fired: list[bool] = []

    def undone(job: Any, token: Any, name: str, *, because: str) -> None:
        real(job, token, name, because=because)
        if name == "b" and not fired:
            fired.append(True)
            raise Interrupted("timeout")  # right after the commit

    monkeypatch.setattr(step_undos, "undone", undone)
    try:
        job = services.enqueue("t.edge_undo", {})
        drain()
    finally:
        registry.unregister("t.edge_undo")
    job.refresh_from_db()
    assert job.status == Status.FAILED and calls == ["B1", "A1"], job.error_message
    assert statuses(job) == {"a": "undone", "b": "undone", "c": "failed"}


def test_a_failure_while_a_cancel_is_pending_runs_no_undo_even_on_the_last_attempt():
    # "A cancel is not a failure and runs no undo": on the last attempt the undos
    # ran, then the job ended cancelled.
    undone: list[str] = []

    class Cancelled(jobstate.Workflow):
        @jobstate.step(undo="undo_a")
        def a(self, ctx: Any) -> str:
            return "A1"

        @jobstate.step()
        def b(self, ctx: Any, a: str) -> None:
            services.request_cancel(ctx.job.pk, "ops", "stop it")  # an operator, meanwhile
            raise RuntimeError("broke while being cancelled")

        def undo_a(self, ctx: Any, output: str) -> None:
            undone.append(output)

    jobstate.workflow("t.edge_cancel", max_attempts=1, retry_backoff=0)(Cancelled)
    try:
        job = services.enqueue("t.edge_cancel", {})
        drain()
    finally:
        registry.unregister("t.edge_cancel")
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and undone == []
    assert statuses(job) == {"a": "completed", "b": "failed"}


class Unprintable(NonRetryable):
    def __str__(self) -> str:
        raise RuntimeError("cannot print this error")


def test_a_step_error_whose_str_raises_is_recorded_as_itself_and_compensates(saga):
    # Its message was formatted with f"{exc}" inside the except clause: the RuntimeError
    # of printing it replaced the step's error, skipped the step's failure record and
    # the undos, and was retried as any RuntimeError.
    undone = saga("t.edge_unprintable", b_raises=Unprintable())
    job = services.enqueue("t.edge_unprintable", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1
    assert job.error_message == "step 'b' failed: Unprintable: Unprintable(); undone: a"
    assert undone == ["A1"]
    assert statuses(job) == {"a": "undone", "b": "failed"}
    assert "Unprintable()" in JobStep.objects.get(job_id=job.pk, name="b").error_message


def test_later_steps_and_result_get_an_output_as_it_was_stored():
    # The run handed on what the step returned (a tuple, an int key), a resumed run what
    # was stored (a list, a text key): a later step behaved differently after a crash.
    seen: list[Any] = []

    class Shapes(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> dict[Any, Any]:
            return {"pair": (1, 2), 3: "three"}

        @jobstate.step()
        def b(self, ctx: Any, a: dict[str, Any]) -> None:
            seen.append(a)

        def result(self, outputs: dict[str, Any]) -> Any:
            seen.append(outputs["a"])
            return "done"

    jobstate.workflow("t.edge_shapes", max_attempts=1)(Shapes)
    try:
        job = services.enqueue("t.edge_shapes", {})
        drain()
    finally:
        registry.unregister("t.edge_shapes")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED, job.error_message
    stored = JobStep.objects.get(job_id=job.pk, name="a").output
    assert stored == {"pair": [1, 2], "3": "three"}
    assert seen == [stored, stored]


@pytest.mark.parametrize("second", ["iterate", "batches"])
def test_a_second_iteration_in_a_step_is_refused_instead_of_skipping_items(second):
    # The second loop started at the first one's item count (the step's one cursor):
    # of b1..b5 it walked b4 and b5, and the step completed.
    seen: list[Any] = []

    class Twice(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> None:
            for x in ctx.iterate(["a1", "a2", "a3"]):
                seen.append(x)
            items = ["b1", "b2", "b3", "b4", "b5"]
            for y in ctx.iterate(items) if second == "iterate" else ctx.batches(items):
                seen.append(y)

    jobstate.workflow("t.edge_twice", max_attempts=3)(Twice)
    try:
        job = services.enqueue("t.edge_twice", {})
        drain()
    finally:
        registry.unregister("t.edge_twice")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.FAILED, 1)
    assert "iterates once" in job.error_message and "of loop 1, loop 2 would skip" in job.error_message
    assert seen == ["a1", "a2", "a3"]


def nothing(how: str) -> Any:
    """An empty loop of each kind: a list, an iterator (no length), a QuerySet, batches."""
    if how == "generator":
        return (x for x in ())
    if how == "queryset":
        return Effect.objects.filter(job_id=uuid.uuid4()).order_by("pk")
    return []


@pytest.mark.parametrize("first", ["list", "generator", "queryset", "batches"])
def test_a_loop_over_nothing_leaves_the_steps_iteration_to_the_next_loop(first):
    # The empty loop took the step's one iteration, and the loop after it was refused,
    # though nothing had been checkpointed. Failed after its checkpoint at b2, the step
    # runs again: the empty loop walks nothing again, the next one resumes at b3.
    seen: list[Any] = []

    class EmptyFirst(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> Any:
            empty = nothing(first)
            for x in ctx.batches(empty) if first == "batches" else ctx.iterate(empty):
                seen.append(x)
            for y in ctx.iterate(["b1", "b2", "b3", "b4", "b5"], every=2):
                seen.append(y)
                if y == "b4" and ctx.step_attempt == 1:
                    raise RuntimeError("b4")
            for z in ctx.iterate([]):  # nothing to resume either: allowed after the iteration
                seen.append(z)
            return ctx.cursor

    jobstate.workflow("t.edge_empty_first", max_attempts=2, retry_backoff=0)(EmptyFirst)
    try:
        job = services.enqueue("t.edge_empty_first", {})
        drain()
    finally:
        registry.unregister("t.edge_empty_first")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == (Status.COMPLETED, 2, 5), job.error_message
    assert seen == ["b1", "b2", "b3", "b4", "b3", "b4", "b5"]
    assert JobStep.objects.get(job_id=job.pk, name="a").detail[items.LOOP] == 1  # the second loop's cursor
    assert items.LOOP not in jobstate.workflows.state(job)["steps"][0]["detail"]  # bookkeeping, not shown


def test_a_resumed_loop_that_is_not_the_one_that_checkpointed_is_refused():
    # The first loop checkpointed at a2 and failed; run again, it has no items left (a
    # queryset of the rows still to do, say), and the second loop would have resumed
    # at the first one's count: b1 and b2 skipped, and the step completed.
    seen: list[Any] = []

    class Shrinks(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> None:
            for x in ctx.iterate(["a1", "a2", "a3"] if ctx.step_attempt == 1 else [], every=1):
                seen.append(x)
                if x == "a3":
                    raise RuntimeError("a3")
            for y in ctx.iterate(["b1", "b2", "b3", "b4", "b5"]):
                seen.append(y)

    jobstate.workflow("t.edge_shrinks", max_attempts=3, retry_backoff=0)(Shrinks)
    try:
        job = services.enqueue("t.edge_shrinks", {})
        drain()
    finally:
        registry.unregister("t.edge_shrinks")
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.FAILED, 2)
    assert "iterates once" in job.error_message
    assert "counts 2 items of loop 1, loop 2 is the first with items now" in job.error_message
    assert seen == ["a1", "a2", "a3"]
