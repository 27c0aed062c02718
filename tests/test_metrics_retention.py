"""Retention folds the history it deletes into the metrics' counters first: jobs
finished, never scraped, then pruned are counted exactly once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from jobstate import services
from jobstate.metrics import gauges, totals
from jobstate.metrics.models import MetricTotal
from jobstate.models import Job, JobEvent
from jobstate.worker.retention import prune
from jobstate.worker.runner import drain
from tests.test_metrics import OPEN, scrape, value

pytestmark = pytest.mark.django_db

TINY = 1e-9  # every step's deadline has passed after its first batch


@pytest.fixture(autouse=True)
def fresh_snapshot():
    gauges.reset()
    yield
    gauges.reset()


@pytest.fixture
def boom(temp_handler: Any) -> None:
    def fail(ctx: Any) -> None:
        raise ValueError("boom")

    temp_handler("test.boom", fail, max_attempts=1)


def stored(*parts: str) -> float | None:
    return MetricTotal.objects.filter(key=totals.key(*parts)).values_list("value", flat=True).first()


@override_settings(JOBSTATE={**OPEN, "METRICS_FOLD_BATCH": 3})
def test_pruned_jobs_that_no_scrape_reached_are_counted_once(client: Any, boom: None) -> None:
    scrape(client)  # counting starts: the cursor is placed
    for _ in range(3):
        services.enqueue("test.echo", {})
    services.enqueue("test.boom", {})
    drain()  # 4 jobs finished, 12 more history rows, 4 batches of 3: no scrape meanwhile
    report = prune(days=0)
    assert report.jobs == 4 and not Job.objects.exists() and not report.more
    # Counted before the rows went, without a scrape.
    assert stored("outcomes", "test.echo", "completed") == 3
    assert stored("outcomes", "test.boom", "failed") == 1
    assert stored("run_count", "test.echo", "completed") == 3
    assert stored("wait_count", "test.boom") == 1
    s = scrape(client)
    assert s == scrape(client)  # and not a second time by the scrapes
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 3
    assert value(s, "jobstate_outcomes_total", kind="test.boom", outcome="failed") == 1
    assert value(s, "jobstate_run_seconds_count", kind="test.echo", outcome="completed") == 3
    assert value(s, "jobstate_queue_wait_seconds_count", kind="test.echo") == 3
    enqueued = {"from_status": "none", "to_status": "queued", "transition": "enqueue"}
    assert value(s, "jobstate_transitions_total", kind="test.echo", **enqueued) == 3


@override_settings(JOBSTATE={**OPEN, "METRICS_FOLD_BATCH": 2})
def test_a_prune_out_of_time_keeps_the_jobs_the_fold_has_not_reached(client: Any) -> None:
    services.enqueue("test.echo", {})
    scrape(client)
    for _ in range(3):
        services.enqueue("test.echo", {})
    drain()
    # One batch of 2 rows folded: the rest of the history waits, and so do its jobs.
    report = prune(days=0, max_seconds=TINY)
    assert report.more and report.jobs < 4 and Job.objects.exists()
    while report.more:
        report = prune(days=0, max_seconds=TINY)
    assert not Job.objects.exists()
    assert stored("outcomes", "test.echo", "completed") == 4
    s = scrape(client)
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 4
    assert value(s, "jobstate_run_seconds_count", kind="test.echo", outcome="completed") == 4


@override_settings(JOBSTATE=OPEN)
def test_a_prune_starts_no_counting_before_the_first_scrape() -> None:
    services.enqueue("test.echo", {})
    drain()
    assert prune(days=0).jobs == 1
    assert not MetricTotal.objects.exists()


@override_settings(JOBSTATE={**OPEN, "METRICS_SETTLE_SECONDS": 60})
def test_the_dry_run_keeps_the_jobs_whose_history_the_fold_would_not_reach(client: Any) -> None:
    # The dry run counted every old job; the prune keeps one with a history row the fold
    # does not reach (younger than METRICS_SETTLE_SECONDS by the row's clock: a worker's
    # clock ahead, say), and its parent: the dry run said 3, the prune deleted 1.
    scrape(client)  # counting starts
    parent = services.enqueue("test.echo", {})
    child = services.enqueue("test.echo", {}, parent=parent)
    reached = services.enqueue("test.echo", {}, priority=1)  # run first: its rows come before
    drain()
    long_ago = timezone.now() - timedelta(days=40)
    Job.objects.update(finished_at=long_ago)
    last = JobEvent.objects.filter(job=child).latest("id")
    assert last.id == JobEvent.objects.latest("id").id
    JobEvent.objects.exclude(pk=last.pk).update(created_at=long_ago)  # only the last row is young
    dry = prune(days=30, dry_run=True)
    assert (dry.jobs, dry.events) == (1, JobEvent.objects.filter(job=reached).count())
    assert prune(days=30).jobs == 1
    assert set(Job.objects.values_list("pk", flat=True)) == {parent.pk, child.pk}
