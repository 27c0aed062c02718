"""Retention of workflow trees: a tree goes in as many statements whatever its depth
(children before their parents), and a job that stays, or is added under a job the
prune has read, keeps the jobs above it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate.models import Asset, Job, JobEvent
from jobstate.states import Status
from jobstate.worker import retention

pytestmark = pytest.mark.django_db(transaction=True)


def old_job(parent: Job | None = None, days_ago: float = 40) -> Job:
    return Job(
        kind="test.echo",
        status=Status.COMPLETED,
        progress=100,
        finished_at=timezone.now() - timedelta(days=days_ago),
        parent=parent,
    )


def tree(levels: int, fanout: int, widest: int = 16) -> list[Job]:
    """A finished workflow tree 40 days old: ``levels`` deep, ``fanout`` children a job
    (at most ``widest`` a level), a history row and an asset each."""
    level = [old_job()]
    jobs = list(level)
    for _ in range(levels - 1):
        level = [old_job(parent) for parent in level for _ in range(fanout)][:widest]
        jobs.extend(level)
    Job.objects.bulk_create(jobs)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, from_status=Status.PROCESSING, to_status=Status.COMPLETED, transition="complete")
        for job in jobs
    )
    Asset.objects.bulk_create(
        Asset(job=job, asset_type="report", name="r", url="https://example.com/r") for job in jobs
    )
    return jobs


def pruned(levels: int, fanout: int) -> tuple[int, int]:
    """The jobs in such a tree, and the statements a prune took to delete it whole."""
    jobs = tree(levels, fanout)
    with CaptureQueriesContext(connection) as queries:
        report = retention.prune(30)
    assert (report.jobs, report.events, report.assets) == (len(jobs),) * 3
    assert not Job.objects.exists()
    return len(jobs), len(queries)


def test_a_tree_goes_in_as_many_statements_whatever_its_depth():
    # Only childless jobs went, a batch at a time: a tree n levels deep took n batches
    # (their statements, and a read of every old job's ancestors each, 40 s a batch at
    # 12,000 jobs on PostgreSQL).
    small, shallow = pruned(levels=2, fanout=2)
    large, deep = pruned(levels=9, fanout=2)
    assert (small, large) == (3, 95)  # one batch, and under Django's 100 rows per DELETE
    assert deep == shallow


def test_a_deep_tree_goes_batch_after_batch_children_first(settings):
    settings.JOBSTATE = {"PRUNE_BATCH": 4}
    jobs = tree(levels=6, fanout=2)
    report = retention.prune(30)
    assert report.jobs == len(jobs) == 47 and not Job.objects.exists()


def test_a_job_that_stays_deep_in_a_tree_keeps_only_its_ancestors(settings):
    settings.JOBSTATE = {"PRUNE_BATCH": 3}
    jobs = tree(levels=5, fanout=2)
    leaf = jobs[-1]
    recent = old_job(parent=leaf, days_ago=1)
    recent.save()
    above = [leaf]
    while above[-1].parent_id is not None:
        above.append(Job.objects.get(pk=above[-1].parent_id))
    assert len(above) == 5
    assert retention.prune(30, dry_run=True).jobs == len(jobs) - 5
    assert retention.prune(30).jobs == len(jobs) - 5
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, *(job.pk for job in above)}


def test_children_finished_after_their_old_parent_go_with_it(settings, monkeypatch):
    # Each read takes the oldest jobs that would go (here one) and every job below them:
    # the parent alone, older than its children, would wait for them for ever.
    settings.JOBSTATE = {"PRUNE_BATCH": 1}
    monkeypatch.setattr(retention, "ROUND_BATCHES", 1)
    parent = old_job(days_ago=50)
    parent.save()
    Job.objects.bulk_create([old_job(parent), old_job(parent)])
    assert retention.prune(30).jobs == 3 and not Job.objects.exists()


@pytest.mark.parametrize("link", ["parent", "retry_of"])
def test_a_job_added_after_the_prune_read_its_jobs_keeps_them(monkeypatch, link):
    # The batch checks its jobs again: a child (or an active retry) committed since the
    # read keeps its job and the jobs above it.
    jobs = tree(levels=3, fanout=1)
    top, middle, bottom = jobs
    target = middle if link == "parent" else bottom
    real = retention._round
    added: list[Job] = []

    def read_then_add(*args: Any) -> list[Any]:
        found = real(*args)
        if not added:
            added.append(Job.objects.create(kind="test.echo", **{link: target}))  # queued: active
        return found

    monkeypatch.setattr(retention, "_round", read_then_add)
    report = retention.prune(30)
    kept = {top.pk, middle.pk, added[0].pk} | ({bottom.pk} if link == "retry_of" else set())
    assert report.jobs == 3 - len(kept & {top.pk, middle.pk, bottom.pk})
    assert set(Job.objects.values_list("pk", flat=True)) == kept
