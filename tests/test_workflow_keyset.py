"""``ctx.iterate``/``ctx.batches`` read a QuerySet by keyset where it is exact (every
chunk after the first continues after the last row's ordering values, no OFFSET), and
give the rows in exactly the order OFFSET reading gives them; a resume continues after
the row its checkpoint stored, without gap or repeat."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import F, QuerySet
from django.db.models.functions import Lower
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.models import JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job
from jobstate.workflows import items, keyset
from tests.models import Effect, Ledger
from tests.workflow_jobs import SimulatedCrash

T0 = datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture
def ledger() -> None:
    """41 rows: names, ranks (a third NULL), amounts, days and times (NULL, or a
    microsecond apart) that tie, in an insertion order unlike any of them."""
    Ledger.objects.bulk_create(
        Ledger(
            name="abc"[i * 7 % 3],
            rank=None if i % 3 == 0 else i % 4,
            amount=Decimal("1.10") * (i % 3),
            day=date(2024, 1, 1 + i % 2),
            at=None if i % 5 == 0 else T0 + timedelta(microseconds=i * 7 % 4),
            code=uuid.uuid4(),
            blob=bytes([i % 3]),
        )
        for i in range(41)
    )


def read(qs: QuerySet[Any], size: int, start: int = 0, stored: Any = None) -> tuple[list[Any], items.Chunks]:
    chunks = items.rows_from(qs, start, 1, stored)
    assert isinstance(chunks, items.Chunks)
    chunks.size = size
    return list(chunks), chunks


def sql_of(run: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        run()
    return [q["sql"] for q in captured.captured_queries]


KEYSET: dict[str, Callable[[], QuerySet[Any]]] = {
    "name": lambda: Ledger.objects.order_by("name"),
    "-name": lambda: Ledger.objects.order_by("-name"),
    "name,-amount": lambda: Ledger.objects.order_by("name", "-amount"),
    "-day,amount,-pk": lambda: Ledger.objects.order_by("-day", "amount", "-pk"),
    "rank": lambda: Ledger.objects.order_by("rank"),
    "-rank,name": lambda: Ledger.objects.order_by("-rank", "name"),
    "rank nulls last": lambda: Ledger.objects.order_by(F("rank").asc(nulls_last=True)),
    "-rank nulls last": lambda: Ledger.objects.order_by(F("rank").desc(nulls_last=True), "-id"),
    "rank nulls first": lambda: Ledger.objects.order_by(F("rank").asc(nulls_first=True), "-name"),
    "at": lambda: Ledger.objects.order_by("at"),
    "-at,day": lambda: Ledger.objects.order_by("-at", "day"),
    "code": lambda: Ledger.objects.order_by("code"),
    "reversed": lambda: Ledger.objects.order_by("name", F("rank").asc(nulls_first=True)).reverse(),
    "values": lambda: Ledger.objects.order_by("name", "-at").values("at", "name", "pk"),
    "values_list": lambda: Ledger.objects.order_by("rank").values_list("amount", "rank", "id"),
    "named": lambda: Ledger.objects.order_by("-amount").values_list("id", "amount", named=True),
    "flat": lambda: Ledger.objects.order_by("-id").values_list("id", flat=True),
    "only": lambda: Ledger.objects.order_by("day").only("day"),
    "defer": lambda: Ledger.objects.order_by("day").defer("name"),
    "meta": lambda: Effect.objects.all(),  # Meta.ordering ("id",)
}
# Read with OFFSET: the rows do not hold the ordering values, or the order is not on
# plain fields of the model.
OFFSET: dict[str, Callable[[], QuerySet[Any]]] = {
    "expression": lambda: Ledger.objects.order_by(Lower("name")),
    "binary": lambda: Ledger.objects.order_by("blob"),
    "deferred": lambda: Ledger.objects.order_by("name").defer("name"),
    "not selected": lambda: Ledger.objects.order_by("name").values_list("amount", flat=True),
    "no pk": lambda: Ledger.objects.order_by("name", "day").values("name", "day").distinct(),
    "annotation": lambda: Ledger.objects.annotate(n=F("rank") * 2).order_by("n"),
}


def expected(qs: QuerySet[Any]) -> list[Any]:
    return list(items.by_pk_last(qs).all())  # one query: the database's own order


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("name", KEYSET)
def test_keyset_chunks_give_the_rows_in_the_order_offset_chunks_give(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "meta":
        Effect.objects.bulk_create(Effect(job_id=uuid.uuid4(), label="x", item=i) for i in range(41))
    qs = KEYSET[name]()
    rows, chunks = read(qs, 4)
    assert chunks.keyset is not None
    assert rows == expected(qs) and len(rows) == 41
    queries = sql_of(lambda: read(qs, 4))
    # Its last row (the read's bound), then 11 chunks.
    assert len(queries) == 12 and queries[0].upper().endswith("LIMIT 1"), queries
    assert not any("OFFSET" in q.upper() for q in queries), queries
    monkeypatch.setattr(keyset, "plan", lambda qs: None)
    assert read(qs, 4)[0] == rows  # the OFFSET path


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("name", OFFSET)
def test_other_querysets_are_read_with_offset(name: str) -> None:
    qs = OFFSET[name]()
    rows, chunks = read(qs, 4)
    assert chunks.keyset is None and chunks.position() is None
    assert rows == expected(qs) and rows
    assert any("OFFSET 4" in q.upper() for q in sql_of(lambda: read(qs, 4)))


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("name", KEYSET)
@pytest.mark.parametrize("cut", [1, 4, 13, 27, 40])
def test_a_stored_position_resumes_after_its_row(name: str, cut: int) -> None:
    """The position goes through JSON as the checkpoint stores it: times keep their
    microseconds (Django's JSON encoder would keep milliseconds), decimals and UUIDs
    come back whole; the resumed read starts without an OFFSET."""
    if name == "meta":
        Effect.objects.bulk_create(Effect(job_id=uuid.uuid4(), label="x", item=i) for i in range(41))
    qs = KEYSET[name]()
    every = expected(qs)
    chunks = items.rows_from(qs, 0, 1)
    assert isinstance(chunks, items.Chunks)
    chunks.size = 4
    it = iter(chunks)
    head = [next(it) for _ in range(cut)]
    stored = json.loads(json.dumps(chunks.position()))
    assert stored["at"] == cut
    queries = sql_of(lambda: read(qs, 4, cut, stored))
    assert not any("OFFSET" in q.upper() for q in queries), queries
    assert head + read(qs, 4, cut, stored)[0] == every


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("name", KEYSET)
def test_upto_a_rows_values_gives_the_rows_up_to_that_row(name: str) -> None:
    if name == "meta":
        Effect.objects.bulk_create(Effect(job_id=uuid.uuid4(), label="x", item=i) for i in range(41))
    qs = items.by_pk_last(KEYSET[name]())
    plan = keyset.plan(qs)
    assert plan is not None
    every = expected(qs)
    for cut in (0, 1, 13, 27, 40):
        assert list(qs.filter(keyset.upto(plan, plan.key(every[cut])))) == every[: cut + 1]


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
def test_rows_added_after_the_last_row_while_it_is_read_are_not_read_nor_after_a_resume() -> None:
    """The read stops at the row that was last when it began; its position keeps that
    row's values, so a resume (even after more rows came) stops there too."""
    qs = Ledger.objects.order_by("name")
    every = expected(qs)

    def add() -> None:
        Ledger.objects.create(name="c", amount=1, day=date(2024, 1, 1), code=uuid.uuid4())  # ties, pk after
        Ledger.objects.create(name="d", amount=1, day=date(2024, 1, 1), code=uuid.uuid4())

    chunks = items.rows_from(qs, 0, 1)
    assert isinstance(chunks, items.Chunks)
    chunks.size = 4
    assert chunks.count() == 41
    it = iter(chunks)
    head = [next(it) for _ in range(13)]
    add()
    stored = json.loads(json.dumps(chunks.position()))
    assert head + list(it) == every
    add()
    resumed = items.rows_from(qs, 13, 1, stored)
    assert isinstance(resumed, items.Chunks)
    resumed.size = 4
    assert resumed.count() == 41 and head + list(resumed) == every


@pytest.mark.django_db
@pytest.mark.usefixtures("ledger")
def test_a_checkpoint_without_a_position_or_for_another_ordering_resumes_by_offset() -> None:
    """A cursor written before keyset reading (the item count only) still resumes at
    its row: the first chunk by OFFSET, the next ones by keyset."""
    qs = Ledger.objects.order_by("name", "-at")
    every = expected(qs)
    chunks = items.rows_from(qs, 0, 1)
    assert isinstance(chunks, items.Chunks)
    it = iter(chunks)
    for _ in range(13):
        next(it)
    elsewhere = {**(chunks.position() or {}), "order": "tests.Ledger:name,id"}
    for stored in (None, elsewhere, {**elsewhere, "at": 12}, {"at": 13, "order": chunks.keyset.signature}):
        queries = sql_of(lambda: read(qs, 4, 13, stored))  # noqa: B023
        assert queries[0].upper().endswith("LIMIT 1")  # its bound, not in a position for it
        assert "OFFSET 13" in queries[1].upper() and not any("OFFSET" in q.upper() for q in queries[2:])
        assert read(qs, 4, 13, stored)[0] == every[13:]


# A workflow over the ledger that crashes mid-way --------------------------------


class Walk(jobstate.Workflow):
    @jobstate.step(batch=5)
    def walk(self, ctx: Any) -> int:
        rows = Ledger.objects.order_by("name", "-at")
        for batch in ctx.batches(rows):
            with batch:
                for row in batch:
                    Effect.objects.create(job_id=ctx.job.pk, label="row", item=row.pk)
                    if ctx.step_attempt == 1 and batch.start == 15:
                        raise SimulatedCrash("walk")
        return int(ctx.cursor)


@pytest.fixture
def walk(monkeypatch: pytest.MonkeyPatch, ledger: None) -> Iterator[None]:
    monkeypatch.setattr(items, "READ_CHUNK", 1)  # the step's batch (5) a query
    jobstate.workflow("t.walk", max_attempts=2, retry_backoff=0)(Walk)
    try:
        yield
    finally:
        registry.unregister("t.walk")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("walk")
@pytest.mark.parametrize("old_checkpoint", [False, True])
def test_a_crashed_walk_resumes_after_its_last_row_without_gap_or_repeat(old_checkpoint: bool) -> None:
    job = services.enqueue("t.walk", {})
    with pytest.raises(SimulatedCrash):
        drain()
    step = JobStep.objects.get(job_id=job.pk, name="walk")
    assert step.cursor == 15
    assert step.detail[items.READ_AFTER]["at"] == 15
    if old_checkpoint:  # as a release before keyset reading left it
        JobStep.objects.filter(pk=step.pk).update(detail={})
    assert services.requeue_expired(now=timezone.now() + timedelta(hours=1)).requeued
    queries = sql_of(lambda: run_job(services.start(job.pk, "w2"), "w2"))
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == 41
    done = list(Effect.objects.filter(job_id=job.pk).order_by("id").values_list("item", flat=True))
    assert done == [r.pk for r in Ledger.objects.order_by("name", "-at", "pk")]
    reads = [q for q in queries if "tests_ledger" in q and "COUNT(" not in q.upper()]
    offsets = [q for q in reads if "OFFSET" in q.upper()]
    # Without a stored position, its bound is read again first (its last row).
    bound = [q for q in reads if q.upper().endswith("LIMIT 1")]
    assert bound == (reads[:1] if old_checkpoint else []), reads
    reads = reads[len(bound) :]
    assert len(reads) == 6 and offsets == (reads[:1] if old_checkpoint else []), reads
    state = jobstate.workflows.state(job)
    assert items.READ_AFTER not in state["steps"][0]["detail"]  # bookkeeping, not shown
