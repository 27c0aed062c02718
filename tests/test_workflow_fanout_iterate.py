"""A fan-out step that spawns its children while it walks its items with
``ctx.iterate``/``ctx.batches``: the spawns for the items a checkpoint moves past are
stored with it, so a step resumed after a crash or a failed attempt starts every
item's child exactly once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.exceptions import NonRetryable
from jobstate.models import Job, JobStep, JobStepSpawn
from jobstate.states import Status
from jobstate.storable import json_value
from jobstate.worker.retention import prune
from jobstate.worker.runner import drain, run_job
from jobstate.workflows import spawns, state
from tests.models import Effect
from tests.workflow_jobs import SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = uuid.UUID(int=11)  # Effect rows under this id: the items, when read as a QuerySet
BROKEN: set[int] = set()  # items whose child fails


def piece(ctx: Any) -> dict[str, int]:
    item = int(ctx.parameters["item"])
    if item in BROKEN:
        raise NonRetryable(f"item {item} broken")
    return {"item": item}


class Spread(jobstate.Workflow):
    """One child per item, spawned while iterating; the first attempt dies (or
    raises) at item ``stop_at``, after the checkpoints at 3 and 6."""

    @jobstate.step(batch=3)
    def split(self, ctx: Any) -> dict[str, int]:
        params = ctx.parameters
        ctx.spawn("t.piece", {"item": -1})  # before the items: made again by every attempt
        for item in walk(ctx, params):
            ctx.spawn("t.piece", {"item": item})
            if item == params.get("stop_at") and ctx.step_attempt == 1 and retried(ctx, params):
                if params.get("how") == "crash":
                    raise SimulatedCrash("split")
                raise RuntimeError("split broke")
        if params.get("fail_after") and ctx.step_attempt == 1:
            raise RuntimeError("after the items")  # every item checkpointed
        return {"attempt": ctx.step_attempt}

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> list[int]:
        return [r["item"] for r in split["results"]]


def retried(ctx: Any, params: dict[str, Any]) -> bool:
    """Stop in the first run, or (``in_retry``) only in a retry of it."""
    return not params.get("in_retry") or ctx.job.retry_of_id is not None


def walk(ctx: Any, params: dict[str, Any]) -> Iterator[int]:
    items: Any = range(10)
    if params.get("queryset"):
        items = Effect.objects.filter(job_id=ROWS).order_by("item").values_list("item", flat=True)
    if not params.get("atomic"):
        yield from ctx.iterate(items)
        return
    for batch in ctx.batches(items):
        with batch:
            yield from batch


@pytest.fixture(autouse=True)
def spread() -> Iterator[None]:
    registry.handler("t.piece", max_attempts=1, api=False)(piece)
    jobstate.workflow("t.spread", max_attempts=2, retry_backoff=0)(Spread)
    Effect.objects.bulk_create(Effect(job_id=ROWS, label="row", item=i) for i in range(10))
    BROKEN.clear()
    yield
    registry.unregister("t.spread")
    registry.unregister("t.piece")


def split_row(job: Job) -> JobStep:
    return JobStep.objects.get(job_id=job.pk, name="split")


def stored_items(job: Job) -> list[int]:
    rows = JobStepSpawn.objects.filter(job_id=job.pk, step="split").order_by("position")
    return [r.parameters["item"] for r in rows]


def spawned_items(job: Job) -> list[int]:
    children = Job.objects.filter(parent=job).order_by("created_at", "id")
    return [c.parameters["item"] for c in children]


def stop_then_finish(params: dict[str, Any]) -> Job:
    job = services.enqueue("t.spread", {"stop_at": 7, **params})
    if params.get("how") == "crash":
        with pytest.raises(SimulatedCrash):
            drain()
        row = split_row(job)
        assert row.cursor == 6  # two chunks checkpointed before the worker died
        assert row.detail[spawns.SPAWNED] == {"at": 6, "count": 6}  # with them, the spawns for items 0..5
        assert stored_items(job) == list(range(6))
        assert spawns.SPAWNED not in state(job)["steps"][0]["detail"]
        assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued == [job.pk]
        run_job(services.start(job.pk, "w2"), "w2")
    else:
        drain()  # attempt 1 fails at item 7 (cursor 6), attempt 2 resumes
    drain()
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("how", ["crash", "raise"])
@pytest.mark.parametrize("source", ["list", "queryset", "batches"])
def test_every_item_gets_exactly_one_child_after_a_resume(how: str, source: str) -> None:
    params = {"how": how, "queryset": source == "queryset", "atomic": source == "batches"}
    job = stop_then_finish(params)
    assert job.status == Status.COMPLETED, job.error_message
    assert spawned_items(job) == [-1, *range(10)]
    assert job.result == [-1, *range(10)]  # the fan-in saw every item, in order
    row = split_row(job)
    assert row.output["total"] == 11 and row.attempts == 2
    assert spawns.SPAWNED not in row.detail  # the children exist: dropped when the step waited
    assert not JobStepSpawn.objects.exists()


def test_a_step_that_fails_after_every_item_was_checkpointed_spawns_them_all_once() -> None:
    job = services.enqueue("t.spread", {"fail_after": True})
    drain()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED, job.error_message
    assert job.result == [-1, *range(10)] and spawned_items(job) == [-1, *range(10)]
    assert split_row(job).cursor == 10  # the second attempt walked no item again


def test_a_step_that_fails_for_good_mid_iteration_starts_no_child() -> None:
    job = services.enqueue("t.spread", {"stop_at": 7}, max_attempts=1)
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "split broke" in job.error_message
    assert not Job.objects.filter(parent=job).exists()


def test_a_retry_resumed_mid_iteration_reuses_the_completed_children_once() -> None:
    """The retry's spawns stored with its checkpoints take the earlier run's completed
    children as its fresh ones do: only the broken item's child runs again."""
    BROKEN.add(4)
    first = services.enqueue("t.spread", {"stop_at": 7, "in_retry": True})
    drain()
    first.refresh_from_db()
    assert first.status == Status.FAILED and first.error_type == "ChildrenFailed"
    old = list(Job.objects.filter(parent=first).order_by("created_at", "id").values_list("pk", flat=True))
    BROKEN.clear()
    again = services.retry(first, "ops", "fixed")
    drain()  # the retry's first attempt fails at item 7 (cursor 6); the second resumes
    again.refresh_from_db()
    assert again.status == Status.COMPLETED, again.error_message
    assert again.result == [-1, *range(10)]
    assert spawned_items(again) == [4]  # the one child that did not complete
    row = split_row(again)
    assert row.attempts == 2
    assert row.detail["reused"]["jobs"] == [str(pk) for i, pk in enumerate(old) if i != 5]  # not item 4


def test_stored_spawns_keep_their_options() -> None:
    job = services.enqueue("t.spread", {})
    when = timezone.now() + timedelta(microseconds=123457)
    child = spawns.ChildSpec("t.piece", {"item": 1}, {"priority": 3, "run_after": when, "max_attempts": 2})
    stored = spawns.Stored(4, 0, [child], fresh=True)
    spawns.save(job.pk, "split", stored)
    entry = json_value(stored.entry(), "detail")  # as the database gives it back
    assert spawns.restored(job.pk, "split", entry, 4) == ([child], 1)
    assert spawns.restored(job.pk, "split", entry, 5) == ([], 0)  # taken at another cursor
    assert spawns.restored(job.pk, "other", entry, 4) == ([], 0)  # another step's


def test_an_entry_of_the_release_before_the_rows_is_taken_back_and_stored_as_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that an older release checkpointed (its spawns a list in ``detail``)
    resumes with them, and its next checkpoint stores them all as rows."""
    saved: list[list[int]] = []  # the items whose spawns each checkpoint adds
    save = spawns.save

    def seen(job_id: Any, step: str, stored: spawns.Stored) -> None:
        saved.append([c.parameters["item"] for c in stored.new])
        save(job_id, step, stored)

    monkeypatch.setattr(spawns, "save", seen)
    job = services.enqueue("t.spread", {"stop_at": 7, "how": "crash"})
    with pytest.raises(SimulatedCrash):
        drain()
    row = split_row(job)
    old = {"at": 6, "children": [["t.piece", {"item": i}, {}] for i in range(6)]}
    JobStep.objects.filter(pk=row.pk).update(detail={**row.detail, spawns.SPAWNED: old})
    JobStepSpawn.objects.all().delete()
    assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued == [job.pk]
    saved.clear()
    run_job(services.start(job.pk, "w2"), "w2")
    drain()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED, job.error_message
    assert spawned_items(job) == [-1, *range(10)]
    assert saved == [list(range(9)), [9]]  # at 9: the list's six as rows too; at 10 the one since


def test_a_fresh_attempt_replaces_what_an_earlier_one_stored_after_its_first() -> None:
    """Spawns stored at a cursor the attempt did not resume from were not taken back:
    its first checkpoint stores its own in their place."""
    job = services.enqueue("t.spread", {})
    made = [spawns.ChildSpec("t.piece", {"item": i}) for i in range(5)]
    spawns.save(job.pk, "split", spawns.Stored(5, 0, made, fresh=True))
    again = [spawns.ChildSpec("t.piece", {"item": 10 + i}) for i in range(2)]
    spawns.save(job.pk, "split", spawns.Stored(2, 0, again, fresh=True))
    assert stored_items(job) == [10, 11]
    more = [spawns.ChildSpec("t.piece", {"item": 12})]
    spawns.save(job.pk, "split", spawns.Stored(3, 2, more, fresh=False))
    assert stored_items(job) == [10, 11, 12]
    assert spawns.restored(job.pk, "split", {spawns.SPAWNED: {"at": 3, "count": 3}}, 3)[1] == 3


def test_pruning_a_job_deletes_its_stored_spawns() -> None:
    job = services.enqueue("t.spread", {"stop_at": 7}, max_attempts=1)
    other = services.enqueue("t.spread", {"stop_at": 7, "how": "crash"})
    with pytest.raises(SimulatedCrash):
        drain()  # ``other`` keeps its stored spawns: still processing
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert stored_items(job) == list(range(6)) and stored_items(other) == list(range(6))
    assert prune(days=0, now=timezone.now() + timedelta(days=1)).jobs == 1
    assert not JobStepSpawn.objects.filter(job_id=job.pk).exists()
    assert stored_items(other) == list(range(6))
