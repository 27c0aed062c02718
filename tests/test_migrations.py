"""Data migrations, run for real: back to the state before, rows written there, then forward."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE_WAITING = [("jobstate", "0009_worker_processes")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_jobs_waiting_behind_a_far_future_date_become_waiting_with_a_history_row():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE_WAITING)
    try:
        Job = old.get_model("jobstate", "Job")
        far = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)
        soon = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        waiting = Job.objects.create(kind="wf.parent", status="queued", run_after=far)
        queued = Job.objects.create(kind="wf.plain", status="queued", run_after=soon)
        done = Job.objects.create(kind="wf.done", status="completed", run_after=far, finished_at=soon)
    finally:
        new = migrate(latest)
    Job, JobEvent = new.get_model("jobstate", "Job"), new.get_model("jobstate", "JobEvent")
    assert Job.objects.get(pk=waiting.pk).status == "waiting"
    assert Job.objects.get(pk=waiting.pk).run_after.year < 2500
    assert Job.objects.get(pk=queued.pk).status == "queued"
    assert Job.objects.get(pk=queued.pk).run_after == soon
    assert Job.objects.get(pk=done.pk).status == "completed"
    (event,) = JobEvent.objects.filter(job_id=waiting.pk)
    assert (event.from_status, event.to_status, event.transition) == ("queued", "waiting", "suspend")
    assert not JobEvent.objects.filter(job_id__in=[queued.pk, done.pk]).exists()
