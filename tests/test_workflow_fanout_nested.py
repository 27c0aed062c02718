"""A retried workflow's fan-out child that did not complete runs again as a retry of
the earlier one (``retry_of``): a child that is itself a workflow then reuses the
completed children of its own fan-out (``jobstate.workflows.reuse``, one level down)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import jobstate
from jobstate import registry, services
from jobstate.exceptions import NonRetryable
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from jobstate.worker.runner import drain
from jobstate.workflows import retry_from
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = uuid.UUID(int=8)  # an Effect row under this id per leaf run
BROKEN: set[int] = set()  # leaves that fail


def leaf(ctx: Any) -> int:
    item = int(ctx.parameters["item"])
    Effect.objects.create(job_id=RUNS, label="leaf", item=item)
    if item in BROKEN:
        raise NonRetryable(f"leaf {item} broken")
    return item


def spawn_leaves(ctx: Any) -> None:
    group = int(ctx.parameters["group"])
    for i in range(3):
        ctx.spawn("t.leaf", {"item": group * 10 + i})


def spawn_inners(ctx: Any) -> None:
    for group in (0, 1):
        ctx.spawn(str(ctx.parameters["inner"]), {"group": group})


class Inner(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        spawn_leaves(ctx)

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> list[int]:
        return list(split["results"])


class PartialInner(jobstate.Workflow):
    @jobstate.step(on_child_failure="partial")
    def split(self, ctx: Any) -> None:
        spawn_leaves(ctx)

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> list[int]:
        return list(split["results"])


class Outer(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        spawn_inners(ctx)

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> list[Any]:
        return list(split["results"])


class UndoneOuter(jobstate.Workflow):
    @jobstate.step(undo="unsplit", on_child_failure="continue")
    def split(self, ctx: Any) -> None:
        spawn_inners(ctx)

    def unsplit(self, ctx: Any, output: Any) -> None:
        pass

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> None:
        raise NonRetryable("merge broken")


@pytest.fixture(autouse=True)
def nested() -> Iterator[None]:
    registry.handler("t.leaf", max_attempts=1, api=False)(leaf)
    jobstate.workflow("t.inner", max_attempts=1)(Inner)
    jobstate.workflow("t.inner_partial", max_attempts=1)(PartialInner)
    jobstate.workflow("t.outer", max_attempts=1)(Outer)
    jobstate.workflow("t.outer_undone", max_attempts=1)(UndoneOuter)
    BROKEN.clear()
    yield
    for kind in ("t.outer_undone", "t.outer", "t.inner_partial", "t.inner", "t.leaf"):
        registry.unregister(kind)


def runs() -> list[int]:
    """How often each leaf ran, leaves 0-2 (group 0) then 10-12 (group 1)."""
    return [Effect.objects.filter(job_id=RUNS, label="leaf", item=i).count() for i in (0, 1, 2, 10, 11, 12)]


def children(job: Job) -> list[Job]:
    return list(Job.objects.filter(parent=job).order_by("created_at", "id"))


def first_run(outer: str, inner: str, ends: Status) -> Job:
    BROKEN.add(1)  # group 0's second leaf
    first = services.enqueue(outer, {"inner": inner})
    drain()
    first.refresh_from_db()
    assert first.status == ends, first.error_message
    assert runs() == [1, 1, 1, 1, 1, 1]
    BROKEN.clear()  # the cause, fixed
    return first


@pytest.mark.parametrize("how", ["services.retry", "retry_from"])
def test_a_failed_child_workflow_runs_again_as_its_retry_reusing_its_completed_children(how: str) -> None:
    first = first_run("t.outer", "t.inner", Status.FAILED)
    failed_inner, done_inner = children(first)
    assert failed_inner.status == Status.FAILED and done_inner.status == Status.COMPLETED
    old_leaves = [str(j.pk) for j in children(failed_inner)]
    again = (
        services.retry(first, "ops", "fixed") if how == "services.retry" else retry_from(first, actor="ops")
    )
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert again.result == [[0, 1, 2], [10, 11, 12]]
    # Only the leaf that failed ran again; group 1's inner workflow was reused whole.
    assert runs() == [1, 2, 1, 1, 1, 1]
    (new_inner,) = children(again)
    assert new_inner.retry_of_id == failed_inner.pk and new_inner.status == Status.COMPLETED
    enqueued = JobEvent.objects.get(job_id=new_inner.pk, transition="enqueue")
    assert enqueued.metadata == {"retry_of": str(failed_inner.pk)}
    assert enqueued.reason == f"child of step 'split', retry of {failed_inner.pk}"
    assert enqueued.actor_label.startswith("worker:")
    waiting = JobEvent.objects.get(job_id=again.pk, transition="step_waiting")
    assert waiting.metadata["retries"] == 1 and waiting.metadata["retries_from"] == str(first.pk)
    # One level down: the new inner workflow reused its two completed leaves and
    # retried the failed one.
    split = new_inner.steps.get(name="split")
    assert split.detail["reused"] == {"from": str(failed_inner.pk), "jobs": [old_leaves[0], old_leaves[2]]}
    (new_leaf,) = children(new_inner)
    assert new_leaf.retry_of_id == uuid.UUID(old_leaves[1])


def test_a_partial_child_workflow_runs_again_as_its_retry() -> None:
    first = first_run("t.outer", "t.inner_partial", Status.PARTIAL)
    partial_inner = children(first)[0]
    assert partial_inner.status == Status.PARTIAL
    again = services.retry(first, "ops")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert runs() == [1, 2, 1, 1, 1, 1]
    assert [j.retry_of_id for j in children(again)] == [partial_inner.pk]


def test_no_child_is_a_retry_when_compensation_undid_the_step() -> None:
    """The undo may have undone the children's work: they all run again, as new jobs."""
    first = first_run("t.outer_undone", "t.inner", Status.FAILED)
    again = services.retry(first, "ops")
    drain()
    assert runs() == [2, 2, 2, 2, 2, 2]
    assert [j.retry_of_id for j in children(again)] == [None, None]


def test_a_child_retried_already_is_retried_by_no_other() -> None:
    first = first_run("t.outer", "t.inner", Status.FAILED)
    failed_inner = children(first)[0]
    elsewhere = services.enqueue("t.inner", {"group": 5}, retry_of=failed_inner)
    services.request_cancel(elsewhere, "ops")
    again = services.retry(first, "ops")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert [j.retry_of_id for j in children(again)] == [None]
    assert runs() == [2, 2, 2, 1, 1, 1]


def test_a_child_retried_by_hand_after_the_plan_is_retried_by_no_other(monkeypatch: Any) -> None:
    """The plan reads the earlier children outside the step's transaction: a retry by hand
    in between keeps its job, and the new spawn starts a child that retries none (a job
    is retried once)."""
    from jobstate.workflows import reuse

    first = first_run("t.outer", "t.inner_partial", Status.PARTIAL)
    partial_inner = children(first)[0]
    planned = reuse.plan
    by_hand: list[Job] = []

    def plan_then_retry_by_hand(*args: Any, **kwargs: Any) -> Any:
        taken = planned(*args, **kwargs)
        if taken.retries and not by_hand:
            by_hand.append(services.retry(partial_inner, "ops", "by hand"))
        return taken

    monkeypatch.setattr(reuse, "plan", plan_then_retry_by_hand)
    again = services.retry(first, "ops")
    drain()
    assert len(by_hand) == 1
    assert list(Job.objects.filter(retry_of=partial_inner)) == by_hand
    assert [j.retry_of_id for j in children(again)] == [None]


def test_prune_keeps_the_grandchildren_a_workflow_retry_reuses() -> None:
    # The retry held the old workflow's children only: the completed leaves of its
    # failed child workflow went, and the retry ran them all again.
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    first = first_run("t.outer", "t.inner", Status.FAILED)
    Job.objects.update(finished_at=timezone.now() - timedelta(days=40))
    again = services.retry(first, "ops")  # queued: active
    out = StringIO()
    call_command("jobstate_prune", stdout=out)
    assert out.getvalue().startswith("deleted 0 job(s)")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert runs() == [1, 2, 1, 1, 1, 1]  # only the leaf that failed ran again


def test_a_workflow_retry_under_way_keeps_the_grandchildren(monkeypatch: pytest.MonkeyPatch) -> None:
    # The batch locked the chains of a job and of its parent only: a retry of the
    # grandparent being made, committed after the batch's re-check, reused none.
    from datetime import timedelta

    from django.utils import timezone

    from tests.test_retention_chains import _postgresql_only, _retry_under_way, command

    _postgresql_only()
    first = first_run("t.outer", "t.inner", Status.FAILED)
    Job.objects.update(finished_at=timezone.now() - timedelta(days=40))
    thread, go, made = _retry_under_way(monkeypatch, lambda: services.retry(first, "ops"))
    try:
        assert command("jobstate_prune").startswith("deleted 0 job(s)")
    finally:
        go.set()
        thread.join(timeout=20)
    drain()
    assert Job.objects.get(pk=made["job"].pk).status == Status.COMPLETED
    assert runs() == [1, 2, 1, 1, 1, 1]
