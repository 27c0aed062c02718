"""What each checkpoint of an iteration that spawns a child per item writes: the
spawns made since the checkpoint before, not every spawn so far (``workflows.spawns``).
Rewritten whole, 50,000 spawns took 500 checkpoints writing 411 MB in all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import jobstate
from jobstate import registry, services
from jobstate.models import JobStep, JobStepSpawn
from jobstate.worker.runner import drain
from jobstate.workflows import steps
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
