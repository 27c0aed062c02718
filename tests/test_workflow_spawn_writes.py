"""What each checkpoint of an iteration that spawns a child per item writes: the
spawns made since the checkpoint before, not every spawn so far (``workflows.spawns``).
Rewritten whole, 50,000 spawns took 500 checkpoints writing 411 MB in all."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

import jobstate
from jobstate import registry, services
from jobstate.models import Job, JobEvent, JobStep, JobStepSpawn
from jobstate.states import Status
from jobstate.worker.runner import drain
from jobstate.workflows import step_waits, steps
from jobstate.workflows.spawns import SPAWNED
from tests.workflow_jobs import SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS, EVERY = 300, 10


class Wide(jobstate.Workflow):
    @jobstate.step(batch=EVERY)
    def split(self, ctx: Any) -> None:
        for item in ctx.iterate(range(ITEMS)):
            ctx.spawn("t.leaf", {"item": item, "label": f"item number {item:05d}"})
        raise SimulatedCrash("split")  # before its children start: what the checkpoints stored stays


@pytest.fixture(autouse=True)
def wide() -> Iterator[None]:
    registry.handler("t.leaf", api=False)(lambda ctx: None)
    jobstate.workflow("t.wide", max_attempts=1)(Wide)
    yield
    registry.unregister("t.wide")
    registry.unregister("t.leaf")


def test_each_checkpoint_writes_only_the_spawns_made_since_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[int] = []  # characters of SQL (values included) each checkpoint sent
    real = steps.checkpoint

    def measured(*args: Any, **kwargs: Any) -> None:
        with CaptureQueriesContext(connection) as queries:
            real(*args, **kwargs)
        written.append(sum(len(q["sql"]) for q in queries.captured_queries))

    monkeypatch.setattr(steps, "checkpoint", measured)
    job = services.enqueue("t.wide", {})
    with pytest.raises(SimulatedCrash):
        drain()
    # The first also clears what an earlier attempt may have left; from the second on,
    # each writes the same (its numbers have as many digits): 10 spawns, not 20 ... 300.
    assert max(written[1:]) <= min(written[1:]) * 1.05, written
    assert JobStep.objects.get(job_id=job.pk, name="split").detail[SPAWNED] == {"at": ITEMS, "count": ITEMS}
    rows = JobStepSpawn.objects.filter(job_id=job.pk, step="split").order_by("position")
    assert [r.parameters["item"] for r in rows] == list(range(ITEMS))
    assert len(written) == ITEMS // EVERY


class Options(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        for item in range(CHILDREN):
            ctx.spawn("t.leaf", {"item": item}, priority=item % 3, max_attempts=1 + item % 2)


CHILDREN = 100


def test_children_start_in_bulk_with_their_options_history_and_order() -> None:
    # One statement per child at least (two, with its history row) made a fan-out of
    # 10,000 children take 25 s on SQLite; in bulk it takes a few statements per batch.
    jobstate.workflow("t.options", max_attempts=1)(Options)
    try:
        job = services.enqueue("t.options", {})
        real = step_waits.wait
        counted: list[int] = []

        def measured(*args: Any, **kwargs: Any) -> Any:
            with CaptureQueriesContext(connection) as queries:
                made = real(*args, **kwargs)
            counted.append(len(queries.captured_queries))
            return made

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(step_waits, "wait", measured)
            drain(kinds=["t.options"])
    finally:
        registry.unregister("t.options")
    assert counted and counted[0] < CHILDREN / 2, counted
    ids = step_waits.children_of(job.pk, "split")
    children = list(Job.objects.filter(parent_id=job.pk).order_by("created_at", "id"))
    assert [str(c.pk) for c in children] == ids  # start order is spawn order
    assert [c.parameters["item"] for c in children] == list(range(CHILDREN))
    assert [(c.priority, c.max_attempts) for c in children] == [(i % 3, 1 + i % 2) for i in range(CHILDREN)]
    assert {c.owner_id for c in children} == {None} and {c.status for c in children} == {Status.QUEUED}
    events = JobEvent.objects.filter(job__parent_id=job.pk)
    rows = [(t, r, json.dumps(m)) for t, r, m in events.values_list("transition", "reason", "metadata")]
    assert rows == [("enqueue", "child of step 'split'", "{}")] * CHILDREN


class Ordered(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        for item in range(ORDERED):
            ctx.spawn("t.ordered", {"item": item})


ORDERED = 40


def test_workers_claim_children_of_equal_priority_in_spawn_order() -> None:
    # Inserted in bulk, the children shared one created_at (and run_after): the claim
    # order (priority DESC, run_after, created_at) left them tied, taken in whatever
    # order the database found them, not the order the step spawned them in.
    registry.handler("t.ordered", api=False)(lambda ctx: None)
    jobstate.workflow("t.ordered_flow", max_attempts=1)(Ordered)
    try:
        job = services.enqueue("t.ordered_flow", {})
        drain(kinds=["t.ordered_flow"])
        spawned = [Job.objects.get(pk=pk) for pk in step_waits.children_of(job.pk, "split")]
        assert [c.parameters["item"] for c in spawned] == list(range(ORDERED))
        keys = [(-c.priority, c.run_after, c.created_at) for c in spawned]
        assert keys == sorted(set(keys))  # no two tied: the claim order is the spawn order
        for child in reversed(spawned):  # rows rewritten: PostgreSQL's heap order reversed
            Job.objects.filter(pk=child.pk).update(parameters=child.parameters)
        taken = [j.parameters["item"] for _ in range(4) for j in services.claim("w", ["t.ordered"], limit=10)]
    finally:
        registry.unregister("t.ordered_flow")
        registry.unregister("t.ordered")
    assert taken == list(range(ORDERED))


class Reused(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        parameters: dict[str, Any] = {"label": "same dict"}
        for item in range(REUSED):
            parameters["item"] = item  # one dict, changed after each spawn
            ctx.spawn("t.leaf", parameters)
        parameters["late"] = object()  # after the last spawn: not the children's


REUSED = 5


def test_spawned_children_are_validated_once_with_their_parameters_as_spawned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # spawn() validated each child and the fan-out validated it again, from the step's
    # own dict: a change after spawn() reached the child (every child took the last
    # item; an unstorable value failed the fan-out).
    validated: list[str] = []
    real = registry.HandlerSpec.validate

    def counted(spec: registry.HandlerSpec, parameters: Any, **options: Any) -> dict[str, Any]:
        validated.append(spec.name)
        return real(spec, parameters, **options)

    monkeypatch.setattr(registry.HandlerSpec, "validate", counted)
    jobstate.workflow("t.reused", max_attempts=1)(Reused)
    try:
        job = services.enqueue("t.reused", {})
        drain(kinds=["t.reused"])
    finally:
        registry.unregister("t.reused")
    assert validated.count("t.leaf") == REUSED
    children = Job.objects.filter(parent_id=job.pk).order_by("created_at", "id")
    assert [c.parameters for c in children] == [{"label": "same dict", "item": i} for i in range(REUSED)]


def test_a_child_is_taken_unvalidated_only_as_checked_child_made_it() -> None:
    parent = services.enqueue("t.leaf", {})
    actor = services.Actor("t")
    checked = services.checked_child("t.leaf", {"item": 1})
    with pytest.raises(TypeError):
        services.Child("t.leaf", {"late": object()}, _checked=True)  # type: ignore[call-arg]
    for forged in (
        dataclasses.replace(checked, parameters={"late": object()}),
        dataclasses.replace(checked, priority=10**6),
    ):
        with pytest.raises(ValidationError):
            services.enqueue_children(parent, [forged], actor=actor)
    assert not Job.objects.filter(parent_id=parent.pk).exists()
    (child,) = services.enqueue_children(parent, [checked.retrying(parent, "again")], actor=actor)
    assert (child.parameters, child.retry_of_id) == ({"item": 1}, parent.pk)
