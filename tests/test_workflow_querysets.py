"""``ctx.iterate`` and ``ctx.batches`` over a QuerySet: counted with COUNT and read in
LIMIT/OFFSET chunks from the step's cursor on, never loaded whole; resume as for a list."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, F
from django.db.models.functions import Lower
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
        if ctx.parameters.get("sliced"):  # every label is "row": the pk breaks the ties
            rows = rows.order_by("label")[3:33]
        with CaptureQueriesContext(connection) as captured:
            try:
                for row in walk(ctx, rows):
                    Effect.objects.create(job_id=ctx.job.pk, label="item", item=row.item)
                    if ctx.parameters.get("grow") and row.item < 12:  # the rows' table grows
                        Effect.objects.create(job_id=ROWS, label="row", item=100 + row.item)
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
    # Attempt 1: the last row (the read's bound, stored with the checkpoints), rows 0-9,
    # 10-19, 20-29 (crash at 23); attempt 2: 20-29, 30-34.
    assert reads[0].upper().endswith("LIMIT 1"), reads
    assert len(reads) == 6 and all("LIMIT 10" in q.upper() for q in reads[1:]), reads
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
@pytest.mark.parametrize("atomic", [False, True])
def test_rows_added_while_a_queryset_is_walked_are_left_out_on_every_attempt(atomic: bool) -> None:
    """The loop walks the rows that matched when it began (up to the last one's ordering
    values): the 12 rows the step adds, and one added before the resume, came after
    them and were walked too, 48 items of a total of 35."""
    job = services.enqueue("t.rows", {"grow": True, "atomic": atomic})
    with pytest.raises(SimulatedCrash):
        drain()
    assert Seen.message == ["20/35"]
    Effect.objects.create(job_id=ROWS, label="row", item=200)
    assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued == [job.pk]
    run_job(services.start(job.pk, "w2"), "w2")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == 35, job.error_message
    assert ran(job) == (list(range(35)) if atomic else [*range(24), *range(20, 35)])
    assert JobStep.objects.get(job_id=job.pk, name="load").cursor == 35


class ReadGrowing(jobstate.Workflow):
    @jobstate.step(batch=10)
    def load(self, ctx: Any) -> int:
        rows = Effect.objects.filter(job_id=ROWS).order_by(Lower("label"), "pk")  # read with OFFSET
        for row in ctx.iterate(rows):
            if row.item < 12:
                Effect.objects.create(job_id=ROWS, label="row", item=100 + row.item)
            Seen.message.append(Job.objects.get(pk=ctx.job.pk).progress_message)
        return int(ctx.cursor)


@pytest.mark.usefixtures("workflow")
def test_a_queryset_read_with_offset_that_grows_never_shows_more_done_than_its_total() -> None:
    """Not bounded (no keyset), it walks the rows added after its end too: its total
    grows with them (``40/40``), where it showed 40/35."""
    jobstate.workflow("t.growing", max_attempts=1)(ReadGrowing)
    try:
        job = services.enqueue("t.growing", {})
        drain()
    finally:
        registry.unregister("t.growing")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == 47, job.error_message
    shown = [tuple(map(int, m.split("/"))) for m in Seen.message if "/" in m]
    assert shown and all(done <= total for done, total in shown), shown
    assert (Seen.message[10], Seen.message[-1]) == ("10/35", "40/40")


@pytest.mark.usefixtures("workflow")
def test_an_unordered_queryset_is_refused_before_any_item() -> None:
    job = services.enqueue("t.rows", {"unordered": True}, max_attempts=1)
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "order it" in job.error_message
    assert ran(job) == [] and Seen.queries == [q for q in Seen.queries if "COUNT(" in q.upper()]


@pytest.mark.usefixtures("workflow")
@pytest.mark.parametrize("atomic", [False, True])
def test_a_sliced_queryset_is_read_in_chunks_with_the_pk_last_and_resumes(atomic: bool) -> None:
    """``order_by("label")[3:33]``: the slice is taken over the ordering with the pk
    appended, so the rows that tie across its edges are the same on every attempt."""
    job = services.enqueue("t.rows", {"sliced": True, "atomic": atomic})
    with pytest.raises(SimulatedCrash):
        drain()
    assert JobStep.objects.get(job_id=job.pk, name="load").cursor == 20 and Seen.message == ["20/30"]
    assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued == [job.pk]
    run_job(services.start(job.pk, "w2"), "w2")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == 30, job.error_message
    assert ran(job) == (list(range(3, 33)) if atomic else [*range(3, 24), *range(23, 33)])
    reads = [q for q in Seen.queries if "COUNT(" not in q.upper()]
    assert all(re.search(r'ORDER BY .*"label" ASC, .*"id" ASC LIMIT 10', q) for q in reads), reads


@pytest.mark.usefixtures("workflow")
def test_an_unordered_sliced_queryset_is_refused_with_what_to_do() -> None:
    rows = Effect.objects.filter(job_id=ROWS).order_by()[:10]
    with pytest.raises(ValueError, match=r"order it before slicing"):
        items.rows_from(rows, 0, 10)


# Orderings with ties: the pk is the chunks' last tie-breaker ------------------------


def tied(order: str) -> Any:
    """Querysets ordered on a field whose values are all equal."""
    if order == "meta":  # Job.Meta.ordering = ("-created_at",)
        return Job.objects.filter(kind="test.echo")
    rows = Effect.objects.filter(job_id=ROWS).order_by("label")  # every label is "row"
    if order == "values_list":
        return rows.values_list("item", flat=True)
    if order == "values":
        return rows.values("item", "label")
    return rows


class ReadTies(jobstate.Workflow):
    @jobstate.step(batch=4)
    def load(self, ctx: Any) -> int:
        rows = tied(ctx.parameters["order"])
        with CaptureQueriesContext(connection) as captured:
            walked = list(ctx.batches(rows)) if ctx.parameters.get("batches") else [ctx.iterate(rows)]
            for part in walked:
                for row in part:
                    seen = row.pk if isinstance(row, Job) else row["item"] if isinstance(row, dict) else row
                    seen = getattr(seen, "item", seen)
                    Effect.objects.create(job_id=ctx.job.pk, label=str(seen))
        Seen.queries += [q["sql"] for q in captured.captured_queries if " LIMIT " in q["sql"].upper()]
        return int(ctx.cursor)


@pytest.fixture
def ties(workflow: None) -> Iterator[None]:
    """The ``workflow`` fixture's 35 rows, 30 jobs enqueued at the same instant, and ``t.ties``."""
    Job.objects.bulk_create(Job(kind="test.echo", parameters={"n": i}) for i in range(30))
    Job.objects.filter(kind="test.echo").update(created_at=timezone.now())
    jobstate.workflow("t.ties", max_attempts=1)(ReadTies)
    try:
        yield
    finally:
        registry.unregister("t.ties")


@pytest.mark.usefixtures("ties")
@pytest.mark.parametrize("order", ["label", "values", "values_list", "meta"])
@pytest.mark.parametrize("batches", [False, True])
def test_a_queryset_ordered_with_ties_is_read_once_per_row_in_chunks(order: str, batches: bool) -> None:
    """Ordered on a field with equal values, LIMIT/OFFSET chunks (of 4 here) could skip
    and repeat rows on PostgreSQL: the pk is appended as the last tie-breaker."""
    job = services.enqueue("t.ties", {"order": order, "batches": batches})
    run_job(services.start(job.pk, "w1"), "w1")  # (not drain(): the 30 jobs stay queued)
    job.refresh_from_db()
    expected = sorted(str(r.pk) for r in tied("meta")) if order == "meta" else [str(i) for i in range(35)]
    assert job.status == Status.COMPLETED and job.result == len(expected)
    seen = sorted(Effect.objects.filter(job_id=job.pk).values_list("label", flat=True))
    assert seen == sorted(expected)  # every row exactly once
    pk = f'"{tied(order).model._meta.db_table}"."id"'
    chunks = Seen.queries
    if order in ("label", "meta"):  # read by keyset: its last row first, the read's bound
        bound, *chunks = Seen.queries
        assert re.search(rf"ORDER BY .*, {re.escape(pk)} DESC LIMIT 1$", bound), bound
    assert len(chunks) == len(expected) // 4 + 1
    assert all(re.search(rf"ORDER BY .*, {re.escape(pk)} ASC LIMIT", q) for q in chunks), chunks


def test_the_pk_is_appended_to_an_ordering_unless_it_ends_with_it_or_would_change_the_rows() -> None:
    rows = Effect.objects.filter(job_id=ROWS)

    def order_of(qs: Any) -> list[Any]:
        return list(items.by_pk_last(qs).query.order_by)

    assert order_of(rows.order_by("label")) == ["label", "pk"]
    assert order_of(rows.order_by("-label").values("label")) == ["-label", "pk"]
    assert order_of(rows.order_by("label").values_list("item", flat=True)) == ["label", "pk"]
    assert order_of(rows.order_by("label").distinct()) == ["label", "pk"]  # rows: the pk is in them
    assert order_of(rows.order_by("label").values("pk", "label").distinct()) == ["label", "pk"]
    assert order_of(Job.objects.all()) == ["-created_at", "pk"]  # Meta.ordering
    for ended in ("pk", "-pk", "id", "-id"):
        assert order_of(rows.order_by("label", ended)) == ["label", ended]
    desc = F("id").desc()
    assert order_of(rows.order_by(desc)) == [desc]
    # Adding the pk would change the rows: they are left as they are (documented).
    distinct = rows.order_by("label").values("label").distinct()
    grouped = rows.order_by("label").values("label").annotate(n=Count("id"))
    for qs in (distinct, grouped):
        assert items.by_pk_last(qs) is qs
        assert list(items.by_pk_last(qs)) == list(qs)
