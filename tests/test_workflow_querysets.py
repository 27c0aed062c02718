"""``ctx.iterate`` and ``ctx.batches`` over a QuerySet: counted with COUNT and read in
LIMIT/OFFSET chunks from the step's cursor on, never loaded whole; resume as for a list."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.models import Job, JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job
from jobstate.workflows import items
from tests.models import Effect
from tests.workflow_jobs import SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = uuid.uuid4()  # the job_id of the rows the step reads


class Seen:
    """What the step saw: its queries on the rows' table, whether the queryset was left
    unevaluated, and the job's progress message at its last checkpoint before a crash."""

    queries: list[str] = []
    unevaluated: list[bool] = []
    message: list[str] = []


class ReadRows(jobstate.Workflow):
    @jobstate.step(batch=10)
    def load(self, ctx: Any) -> int:
        rows = Effect.objects.filter(job_id=ROWS).order_by("pk")
        if ctx.parameters.get("unordered"):
            rows = rows.order_by()
        with CaptureQueriesContext(connection) as captured:
            try:
                for row in walk(ctx, rows):
                    Effect.objects.create(job_id=ctx.job.pk, label="item", item=row.item)
                    if row.item == 23 and ctx.step_attempt == 1:
                        Seen.message.append(Job.objects.get(pk=ctx.job.pk).progress_message)
                        raise SimulatedCrash("load")
            finally:
                Seen.queries += [q["sql"] for q in captured.captured_queries if reads_rows(q["sql"])]
        Seen.unevaluated.append(rows._result_cache is None)
        return int(ctx.cursor)


def walk(ctx: Any, rows: Any) -> Iterator[Any]:
    if not ctx.parameters.get("atomic"):
        yield from ctx.iterate(rows)
        return
    for batch in ctx.batches(rows):
        with batch:
            yield from batch


def reads_rows(sql: str) -> bool:
    return sql.lstrip().upper().startswith("SELECT") and "tests_effect" in sql


@pytest.fixture
def workflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(items, "READ_CHUNK", 1)  # read the step's batch (10) a query
    Seen.queries, Seen.unevaluated, Seen.message = [], [], []
    Effect.objects.bulk_create(Effect(job_id=ROWS, label="row", item=i) for i in range(35))
    jobstate.workflow("t.rows", max_attempts=2, retry_backoff=0)(ReadRows)
    try:
        yield
    finally:
        registry.unregister("t.rows")


def run_crash_then_resume(params: dict[str, Any]) -> Job:
    job = services.enqueue("t.rows", params)
    with pytest.raises(SimulatedCrash):
        drain()
    assert JobStep.objects.get(job_id=job.pk, name="load").cursor == 20
    assert Seen.message == ["20/35"]  # the total is counted
    assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued
    run_job(services.start(job.pk, "w2"), "w2")  # another worker, once the lease ran out
    job.refresh_from_db()
    return job


def ran(job: Job) -> list[int]:
    return list(Effect.objects.filter(job_id=job.pk, label="item").values_list("item", flat=True))


def assert_read_in_chunks() -> None:
    counts = [q for q in Seen.queries if "COUNT(" in q.upper()]
    reads = [q for q in Seen.queries if "COUNT(" not in q.upper()]
    assert len(counts) == 2  # one per attempt
    # Attempt 1: rows 0-9, 10-19, 20-29 (crash at 23); attempt 2: 20-29, 30-34.
    assert len(reads) == 5 and all("LIMIT 10" in q.upper() for q in reads), reads
    assert Seen.unevaluated == [True]


@pytest.mark.usefixtures("workflow")
def test_iterate_reads_a_queryset_in_chunks_and_resumes_at_its_cursor() -> None:
    job = run_crash_then_resume({})
    assert job.status == Status.COMPLETED and job.result == 35
    assert ran(job) == [*range(24), *range(20, 35)]  # at least once: 20..23 again
    assert_read_in_chunks()


@pytest.mark.usefixtures("workflow")
def test_batches_read_a_queryset_in_chunks_and_resume_at_the_cursor() -> None:
    job = run_crash_then_resume({"atomic": True})
    assert job.status == Status.COMPLETED and job.result == 35
    assert ran(job) == list(range(35))  # the crashed batch was rolled back
    assert_read_in_chunks()


@pytest.mark.usefixtures("workflow")
def test_an_unordered_queryset_is_refused_before_any_item() -> None:
    job = services.enqueue("t.rows", {"unordered": True}, max_attempts=1)
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "order it" in job.error_message
    assert ran(job) == [] and Seen.queries == [q for q in Seen.queries if "COUNT(" in q.upper()]
