"""Cheap hot writes: no index of the job table covers a column written while a
job runs, so progress, heartbeat and lease updates are HOT on PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import UniqueConstraint, Value
from django.utils import timezone

from jobstate import services
from jobstate.models import Job
from jobstate.models.job import HOT_COLUMNS
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def test_no_index_covers_a_column_written_while_a_job_runs():
    constraints = connection.introspection.get_constraints(connection.cursor(), Job._meta.db_table)
    covered = {
        name: set(info["columns"]) & set(HOT_COLUMNS)
        for name, info in constraints.items()
        if info["index"] or info["unique"]
    }
    assert {name: cols for name, cols in covered.items() if cols} == {}
    # Nor a partial index's condition (CHECK constraints are no index).
    unique = [c for c in Job._meta.constraints if isinstance(c, UniqueConstraint)]
    for index in [*Job._meta.indexes, *unique]:
        condition = str(getattr(index, "condition", "") or "")
        assert not [c for c in HOT_COLUMNS if f"'{c}" in condition or f"{c}__" in condition], index.name


def _table_update_counts() -> tuple[int, int]:
    """Committed updates and HOT updates of the job table, as the statistics see them."""
    with connection.cursor() as cursor:
        # Pending counters reach the shared statistics when the backend next goes
        # idle after this call; the snapshot is cleared so the read sees them.
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pg_stat_get_tuples_updated(%s::regclass), pg_stat_get_tuples_hot_updated(%s::regclass)",
            [Job._meta.db_table, Job._meta.db_table],
        )
        updated, hot = cursor.fetchone()
    return updated, hot


# Committed transactions, as in production: a HOT update needs room on the row's page,
# and only committed dead versions can be pruned to make it. Inside one test
# transaction every version stays live, so enough updates fill the page whatever the
# fillfactor, and the count would depend on what else sits on that page.
@pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_progress_heartbeat_and_lease_updates_are_hot():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Job._meta.db_table])
        assert "fillfactor=85" in (cursor.fetchone()[0] or [])
    job = services.enqueue("test.echo", {})
    (claimed,) = services.claim("host:1", kinds=["test.echo"])
    services.begin(claimed, claimed.lease_token, "host:1:2")

    before = _table_update_counts()
    for percent in range(5, 100, 5):
        services.report_progress(job.pk, claimed.lease_token, percent, f"at {percent}", step="s")
        services.heartbeat(job.pk, claimed.lease_token)
    services.extend_leases("host:1:2", [(job.pk, claimed.lease_token)])
    updated, hot = (a - b for a, b in zip(_table_update_counts(), before, strict=True))
    # Not "all of them": a HOT update also needs room on the row's page, and pruning
    # the page's dead versions to make room waits for every snapshot that might see
    # them (an autovacuum ANALYZE of the table holds one), so now and then one update
    # of the 39 is not HOT (seen in CI: 38 of 39). That no index covers these columns
    # is the deterministic test above; this one measures issue 9's bar, >= 90% HOT.
    assert updated >= 39 and hot >= 0.9 * updated, (updated, hot)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_the_processing_list_reads_the_processing_index():
    # The status index leaves processing jobs out (a claim writes no entry there), so
    # the status filter's list of them must find the processing set's own index, not
    # read the table: here 3,000 finished jobs around 30 processing ones.
    now = timezone.now()
    rows = [
        Job(kind="test.echo", status=Status.COMPLETED, finished_at=now, created_at=now - timedelta(seconds=i))
        for i in range(3000)
    ]
    rows += [
        Job(
            kind="test.echo",
            status=Status.PROCESSING,
            lease_token=uuid.uuid4(),
            lease_expires_at=now,
            created_at=now - timedelta(seconds=i * 100),
        )
        for i in range(30)
    ]
    Job.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    newest = Job.objects.filter(status=Status.PROCESSING).order_by("-created_at")[:100]
    plan = newest.explain()
    assert "jobstate_job_processing_idx" in plan, plan
    assert [j.created_at for j in newest] == sorted((r.created_at for r in rows[3000:]), reverse=True)


def _partial_indexes_holding(job: Job) -> set[str]:
    """The names of the job table's Meta indexes whose condition ``job``'s row meets."""
    values = {}
    for field in Job._meta.concrete_fields:
        value = Value(getattr(job, field.attname), output_field=field)
        values[field.name] = values[field.attname] = value
    return {
        index.name
        for index in Job._meta.indexes
        if index.condition is None or index.condition.check(values, using=connection.alias)
    }


def test_each_step_of_a_system_job_writes_entries_into_few_indexes():
    # Besides the primary key and created_at, which hold every job, each row version of
    # a job without owner, key, parent or retry writes an entry into these indexes only:
    # the claim's and the outcome's index entries are most of a job's WAL (issue 9).
    job = services.enqueue("test.echo", {})
    assert _partial_indexes_holding(Job.objects.get(pk=job.pk)) == {
        "jobstate_job_claim_idx",
        "jobstate_job_status_idx",
        "jobstate_job_kind_idx",
    }
    (claimed,) = services.claim("host:1", kinds=["test.echo"])
    assert _partial_indexes_holding(Job.objects.get(pk=job.pk)) == {
        "jobstate_job_processing_idx",
        "jobstate_job_kind_idx",
    }
    services.complete(claimed, claimed.lease_token, {"ok": True})
    assert _partial_indexes_holding(Job.objects.get(pk=job.pk)) == {
        "jobstate_job_finished_idx",
        "jobstate_job_kind_idx",
    }


# Committed rows, which VACUUM marks all-visible (``vacuumed_jobs``).
@pytest.mark.django_db(transaction=True)
def test_the_fan_in_check_after_a_childs_outcome_reads_only_the_active_childrens_entries(vacuumed_jobs):
    # After each child's outcome, wake_parent_if_done asks whether any child is still
    # active. The parent index held the parent alone, so that read every child of it
    # (the rows too, for their status) until it met an active one: as a fan-out
    # drains, most of its children, once per child. (parent, status) finds them.
    from django.test.utils import CaptureQueriesContext

    from jobstate.services.transitions import wake_parent_if_done

    parent = services.enqueue("test.echo", {})
    now = timezone.now()
    Job.objects.bulk_create(
        [Job(kind="test.echo", status=Status.COMPLETED, finished_at=now) for _ in range(1000)]
        + [
            Job(kind="test.echo", status=Status.COMPLETED, finished_at=now, parent=parent)
            for _ in range(1500)
        ]
        + [Job(kind="test.echo", parent=parent)]
    )
    vacuumed_jobs()
    with CaptureQueriesContext(connection) as seen, transaction.atomic():  # as after an outcome
        assert wake_parent_if_done(parent.pk) is False  # a child is still queued
    (sql,) = [q["sql"] for q in seen.captured_queries if "parent_id" in q["sql"] and "LIMIT 1" in q["sql"]]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN {sql}")
            plan = str(cursor.fetchall())
            assert "Index Only Scan using jobstate_job_parent_status_idx" in plan and "Filter" not in plan, (
                plan
            )
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = str(cursor.fetchall())
            assert "COVERING INDEX jobstate_job_parent_status_idx (parent_id=? AND status=?)" in plan, plan
