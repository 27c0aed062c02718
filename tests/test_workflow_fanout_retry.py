"""A retried workflow's fan-out step reruns only the children that did not complete:
those that completed in the run it retries are reused, their results adopted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.exceptions import NonRetryable
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain
from jobstate.workflows import retry_from, state
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = uuid.UUID(int=7)  # Effect rows under this id are the fan-out's items (a QuerySet)
BROKEN: set[int] = set()  # items whose child fails


def part(ctx: Any) -> dict[str, int]:
    item = int(ctx.parameters["item"])
    Effect.objects.create(job_id=ROWS, label="part", item=item)
    if item in BROKEN:
        raise NonRetryable(f"item {item} broken")
    return {"item": item}


class Redo(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> dict[str, int]:
        items = Effect.objects.filter(job_id=ROWS, label="row").order_by("item")
        for row in items:
            ctx.spawn("t.part", {"item": row.item})
        return {"items": items.count()}

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any] | None) -> list[int]:
        if split is None:
            raise NonRetryable("nothing to merge")
        Effect.objects.create(job_id=ctx.job.pk, label="children", item=ctx.child_jobs().count())
        return [r["item"] for r in split["results"]]


class Undone(jobstate.Workflow):
    @jobstate.step(undo="unsplit", on_child_failure="continue")
    def split(self, ctx: Any) -> None:
        for row in Effect.objects.filter(job_id=ROWS, label="row").order_by("item"):
            ctx.spawn("t.part", {"item": row.item})

    def unsplit(self, ctx: Any, output: Any) -> None:
        Effect.objects.create(job_id=ROWS, label="unsplit")

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> None:
        raise NonRetryable("merge broken")


@pytest.fixture(autouse=True)
def redo() -> Iterator[None]:
    registry.handler("t.part", max_attempts=1, api=False)(part)
    jobstate.workflow("t.redo", max_attempts=1)(Redo)
    jobstate.workflow("t.undone", max_attempts=1)(Undone)
    BROKEN.clear()
    yield
    registry.unregister("t.undone")
    registry.unregister("t.redo")
    registry.unregister("t.part")


def rows(*items: int) -> None:
    Effect.objects.bulk_create([Effect(job_id=ROWS, label="row", item=i) for i in items])


def runs(item: int) -> int:
    return Effect.objects.filter(job_id=ROWS, label="part", item=item).count()


def split_of(job: Job) -> JobStep:
    return JobStep.objects.get(job_id=job.pk, name="split")


def failed_run(*items: int, broken: set[int]) -> Job:
    rows(*items)
    BROKEN.update(broken)
    first = services.enqueue("t.redo", {})
    drain()
    first.refresh_from_db()
    assert first.status == Status.FAILED and "ChildrenFailed" in first.error_type, first.error_message
    BROKEN.clear()  # the cause, fixed
    return first


def children(job: Job) -> list[str]:
    return [
        str(pk)
        for pk in Job.objects.filter(parent=job).order_by("created_at", "id").values_list("pk", flat=True)
    ]


@pytest.mark.parametrize("how", ["services.retry", "retry_from"])
def test_a_retry_after_children_failed_reruns_only_those(how: str) -> None:
    first = failed_run(0, 1, 2, 3, broken={1, 3})
    old = children(first)
    again = (
        services.retry(first, "ops", "fixed") if how == "services.retry" else retry_from(first, actor="ops")
    )
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert again.result == [0, 1, 2, 3]  # the results in the same order as before
    assert [runs(i) for i in range(4)] == [1, 2, 1, 2]  # completed children did not run again
    new = children(again)
    assert len(new) == 2 and set(new).isdisjoint(old)
    split = split_of(again)
    assert split.detail["children"] == [old[0], new[0], old[2], new[1]]
    assert split.detail["reused"] == {"from": str(first.pk), "jobs": [old[0], old[2]]}
    assert split.output["reused"] == {"from": str(first.pk), "jobs": [old[0], old[2]]}
    assert split.output["jobs"] == [old[0], new[0], old[2], new[1]] and split.output["completed"] == 4
    shown = state(again)["steps"][0]
    assert shown["detail"]["reused"]["from"] == str(first.pk)
    assert shown["children"] == {"total": 4, "by_status": {"completed": 4}, "progress": 100.0}
    assert Effect.objects.get(job_id=again.pk, label="children").item == 4  # ctx.child_jobs()
    waiting = JobEvent.objects.get(job_id=again.pk, transition="step_waiting")
    assert waiting.metadata["reused"] == 2 and waiting.metadata["reused_from"] == str(first.pk)
    assert waiting.reason == f"reused 2 completed child jobs of {first.pk}"


def test_children_are_matched_by_their_parameters_not_their_position() -> None:
    """The items' QuerySet changed between the runs: a row came first, another went.
    Pairing by position would hand item 5 the result of item 0's child."""
    first = failed_run(0, 1, 2, broken={1})
    old = children(first)
    Effect.objects.filter(job_id=ROWS, label="row", item=2).delete()
    rows(-5)
    again = services.retry(first, "ops", "fixed")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and again.result == [-5, 0, 1]
    assert [runs(i) for i in (-5, 0, 1, 2)] == [1, 1, 2, 1]
    assert split_of(again).detail["reused"]["jobs"] == [old[0]]


def test_a_retry_of_a_retry_reuses_what_completed_in_either() -> None:
    first = failed_run(0, 1, 2, 3, broken={1, 2})
    BROKEN.add(1)
    second = services.retry(first, "ops")
    drain()
    second.refresh_from_db()
    assert second.status == Status.FAILED and [runs(i) for i in range(4)] == [1, 2, 2, 1]
    BROKEN.clear()
    third = services.retry(second, "ops")
    drain()
    third.refresh_from_db()
    assert third.status == Status.COMPLETED and third.result == [0, 1, 2, 3]
    assert [runs(i) for i in range(4)] == [1, 3, 2, 1]
    a, b = children(first), children(second)
    assert split_of(third).detail["reused"] == {"from": str(second.pk), "jobs": [a[0], b[1], a[3]]}


def test_a_retry_that_skipped_the_fan_out_is_looked_past() -> None:
    first = failed_run(0, 1, 2, broken={2})
    skipped = retry_from(first, "split", skip=["split"], actor="ops")
    drain()
    skipped.refresh_from_db()
    assert skipped.status == Status.FAILED and "nothing to merge" in skipped.error_message
    again = retry_from(skipped, "split", actor="ops")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and again.result == [0, 1, 2]
    assert [runs(i) for i in range(3)] == [1, 1, 2]
    assert split_of(again).detail["reused"]["from"] == str(first.pk)


def test_a_completed_child_that_was_deleted_runs_again() -> None:
    first = failed_run(0, 1, 2, broken={1})
    Job.objects.filter(pk=children(first)[0]).delete()  # retention took it (and its result)
    again = services.retry(first, "ops")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and again.result == [0, 1, 2]
    assert [runs(i) for i in range(3)] == [2, 2, 1]
    assert split_of(again).detail["reused"]["jobs"] == [children(first)[1]]


def test_a_completed_workflow_retried_runs_every_child_again() -> None:
    rows(0, 1)
    first = services.enqueue("t.redo", {})
    drain()
    again = services.retry(first, "ops")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and [runs(0), runs(1)] == [2, 2]
    assert "reused" not in split_of(again).detail and "reused" not in split_of(again).output


def test_retention_keeps_the_reused_children_while_the_retry_needs_them() -> None:
    first = failed_run(0, 1, 2, broken={1})
    old = Job.objects.filter(parent=first)
    Job.objects.filter(pk__in=[first.pk, *old.values_list("pk", flat=True)]).update(
        finished_at=timezone.now() - timedelta(days=400)
    )
    again = services.retry(first, "ops")
    drain(kinds=["t.redo"])  # the retry waits for its one new child
    again.refresh_from_db()
    assert again.status == Status.WAITING
    out = StringIO()
    call_command("jobstate_prune", stdout=out)
    assert out.getvalue().startswith("deleted 0 job(s)")
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and again.result == [0, 1, 2]
    assert [runs(i) for i in range(3)] == [1, 2, 1]


def test_children_of_a_step_that_compensation_undid_run_again() -> None:
    """The step's undo may have undone its children's work: none is reused."""
    rows(0, 1)
    first = services.enqueue("t.undone", {})
    drain()
    first.refresh_from_db()
    assert first.status == Status.FAILED and split_of(first).status == "undone"
    assert Effect.objects.filter(label="unsplit").count() == 1
    again = services.retry(first, "ops")
    drain()
    assert [runs(0), runs(1)] == [2, 2]
    assert "reused" not in split_of(again).detail
