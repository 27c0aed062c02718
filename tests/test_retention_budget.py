"""A prune's time budget (PRUNE_MAX_SECONDS, jobstate_prune --max-seconds): it stops
between batches, says more remains, and the next runs finish the work."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.worker import retention, tasks
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db(transaction=True)

TINY = 1e-9  # every step's deadline has passed after its first batch


def finished(days_ago: float = 40) -> Job:
    job = services.enqueue("test.echo", {})
    drain(kinds=["test.echo"])
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days_ago))
    return job


def old_delivery(user: Any, n: int) -> None:
    from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint

    endpoint, _ = WebhookEndpoint.objects.get_or_create(owner=user, url="https://hooks.example.com/a")
    WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id=f"msg_{n}",
        event="job.completed",
        job_id=str(uuid.uuid4()),
        created_at=timezone.now() - timedelta(days=400),
    )


def orphan(media: Path, job_id: Any = None) -> Path:
    path = media / "jobstate" / str(job_id or uuid.uuid4()) / "never-committed.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan")
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    return path


def test_the_scheduled_prune_stops_at_its_budget_and_the_next_runs_finish(settings, tmp_path, user):
    # It ran until done as a plain django-q2 task: the cluster's timeout killed a long
    # one mid-run, every day, before the deliveries and the orphan files had their turn.
    from jobstate.webhooks.models import WebhookDelivery

    settings.MEDIA_ROOT = tmp_path
    settings.JOBSTATE = {"PRUNE_BATCH": 2, "PRUNE_MAX_SECONDS": TINY}
    olds = [finished() for _ in range(5)]
    recent = finished(days_ago=1)
    for n in range(3):
        old_delivery(user, n)
    orphans = [orphan(tmp_path) for _ in range(3)]

    first = tasks.prune()
    assert first == {"jobs": 2, "events": 6, "assets": 0, "more": 1, "webhook_deliveries": 2}
    assert Job.objects.count() == 4 and WebhookDelivery.objects.count() == 1
    assert sum(path.exists() for path in orphans) == 2  # one job folder swept
    # Whole jobs only: each one left keeps its history.
    assert JobEvent.objects.count() == 3 * Job.objects.count()

    results = [first]
    while results[-1].get("more") and len(results) < 10:
        results.append(tasks.prune())
    assert len(results) == 3, results  # 2 + 2 + 1 jobs; the third folder in the third run
    assert "more" not in results[-1]
    assert list(Job.objects.values_list("pk", flat=True)) == [recent.pk]
    assert not Job.objects.filter(pk__in=[j.pk for j in olds]).exists()
    assert WebhookDelivery.objects.count() == 0
    assert not any(path.exists() for path in orphans)
    assert not (tmp_path / "jobstate" / ".orphan-sweep").exists()  # the round is over


def test_a_huge_backlog_of_jobs_does_not_starve_the_other_steps(settings, tmp_path, user):
    from jobstate.webhooks.models import WebhookDelivery

    settings.MEDIA_ROOT = tmp_path
    settings.JOBSTATE = {"PRUNE_BATCH": 1}
    for _ in range(3):
        finished()
    old_delivery(user, 1)
    stray = orphan(tmp_path)
    report = retention.prune(max_seconds=TINY)
    assert (report.jobs, report.deliveries, report.orphan_files, report.more) == (
        1,
        1,
        [str(stray.relative_to(tmp_path))],
        True,
    )
    assert WebhookDelivery.objects.count() == 0 and not stray.exists()


def test_the_command_runs_until_done_unless_given_a_budget(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    settings.JOBSTATE = {"PRUNE_BATCH": 1, "PRUNE_MAX_SECONDS": TINY}  # the schedule's, not the command's
    for _ in range(3):
        finished()
    out = StringIO()
    call_command("jobstate_prune", "--max-seconds", "0.000001", stdout=out)
    assert out.getvalue().startswith("deleted 1 job(s)")
    assert "more remains: this run stopped after 1e-06 s (--max-seconds); run it again" in out.getvalue()
    out = StringIO()
    call_command("jobstate_prune", stdout=out)
    assert out.getvalue().startswith("deleted 2 job(s)") and "more remains" not in out.getvalue()
    assert not Job.objects.exists()


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_the_command_refuses_a_bad_budget(seconds):
    finished()
    with pytest.raises(CommandError, match="--max-seconds must be a finite number greater than 0"):
        call_command("jobstate_prune", "--max-seconds", seconds, stdout=StringIO())
    assert Job.objects.count() == 1


def test_an_interrupted_orphan_sweep_goes_on_where_it_stopped(settings, tmp_path):
    # The folders of jobs that still exist stay once swept: a sweep that started at
    # the first folder each time would look at the first one only, run after run.
    settings.MEDIA_ROOT = tmp_path
    jobs = sorted((services.enqueue("test.echo", {}) for _ in range(4)), key=lambda j: str(j.pk))
    paths = [orphan(tmp_path, j.pk) for j in jobs]
    sweeps = [services.sweep_orphan_files(deadline=0) for _ in range(4)]
    assert [s.removed for s in sweeps] == [[str(p.relative_to(tmp_path))] for p in paths]
    assert [s.more for s in sweeps] == [True, True, True, False]
    assert not (tmp_path / "jobstate" / ".orphan-sweep").exists()  # the next round starts at the first
    again = orphan(tmp_path, jobs[0].pk)
    assert services.sweep_orphan_files(deadline=0).removed == [str(again.relative_to(tmp_path))]
