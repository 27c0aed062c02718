"""Liveness judged by the clock heartbeats are written by (PostgreSQL: the
database's): the stuck reasons, the worker processes alive, the admin's workers
panel and process list, from a web or reaper process whose own clock is off."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from jobstate import services, stuck
from jobstate.admin import workers as workers_admin
from jobstate.models import Job, WorkerProcess
from jobstate.models.job import LeaseClock
from jobstate.services import workers

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite is one machine: one clock for writers and judges"
    ),
]

SKEWS = [timedelta(minutes=-10), timedelta(minutes=10)]
NAME = "web-1:400:401"


def skew_clock(monkeypatch: pytest.MonkeyPatch, by: timedelta) -> None:
    real = timezone.now

    def now() -> datetime:
        return real() + by

    monkeypatch.setattr(timezone, "now", now)


def running() -> Job:
    services.enqueue("test.echo", {})
    (job,) = services.claim(NAME, start=True)
    services.heartbeat(job, job.lease_token)
    return job


@pytest.mark.parametrize("skew", SKEWS, ids=["behind", "ahead"])
def test_a_job_that_heartbeats_is_not_stuck_whatever_this_clock_says(monkeypatch, skew):
    job = running()
    skew_clock(monkeypatch, skew)
    assert stuck.check(Job.objects.get(pk=job.pk)) is None
    assert stuck.find_stuck() == []
    assert set(stuck.count_stuck().values()) == {0}


def test_a_lease_expired_by_the_database_clock_is_found_by_a_clock_behind(monkeypatch):
    job = running()
    Job.objects.filter(pk=job.pk).update(lease_expires_at=LeaseClock(-5))
    skew_clock(monkeypatch, timedelta(minutes=-10))
    assert [f.reason for f in stuck.find_stuck()] == [stuck.LEASE_EXPIRED]
    assert stuck.count_stuck()[stuck.LEASE_EXPIRED] == 1
    finding = stuck.check(Job.objects.get(pk=job.pk))
    assert finding is not None and finding.reason == stuck.LEASE_EXPIRED


@pytest.mark.parametrize("skew", SKEWS, ids=["behind", "ahead"])
def test_a_process_that_beats_is_alive_and_kept(monkeypatch, skew):
    skew_clock(monkeypatch, skew)
    for _ in range(2):  # the first beat inserts the row, the next updates it
        workers.beat(NAME, cluster="web-1:400", role="worker")
        seen = WorkerProcess.objects.annotate(now=LeaseClock()).values_list("seen_at", "now").get()
        assert abs(seen[0] - seen[1]) < timedelta(seconds=1)  # written by the database's clock
    assert list(workers.alive().values_list("name", flat=True)) == [NAME]
    assert workers.forget_dead(older_than_seconds=60) == 0
    found = workers_admin.panel_context()["workers"]
    assert (found.alive, found.dead) == (1, 0)


@pytest.mark.parametrize("skew", SKEWS, ids=["behind", "ahead"])
def test_the_process_list_shows_a_process_that_beats_alive(admin_client: Any, monkeypatch, skew):
    workers.beat(NAME, cluster="web-1:400", role="worker")
    workers.beat(NAME, cluster="web-1:400", role="worker")
    skew_clock(monkeypatch, skew)
    html = admin_client.get(reverse("admin:jobstate_workerprocess_changelist")).content.decode()
    state = re.search(r'<td class="field-state_col">(.*?)</td>', html, re.S)
    seen = re.search(r'<td class="field-seen_col">(.*?)</td>', html, re.S)
    assert state is not None and "idle" in state.group(1)
    assert seen is not None and seen.group(1).strip() in ("0s ago", "1s ago"), seen.group(1)


def test_the_dashboard_panel_and_the_stuck_page_judge_by_the_database_clock(admin_client: Any, monkeypatch):
    running()
    workers.beat(NAME, cluster="web-1:400", role="worker")
    skew_clock(monkeypatch, timedelta(minutes=10))
    dashboard = admin_client.get(reverse("admin:jobstate_job_dashboard"))
    assert dashboard.context["workers"].alive == 1
    page = admin_client.get(reverse("admin:jobstate_job_stuck"))
    assert page.context["total"] == 0
    live = admin_client.get(reverse("admin:jobstate_job_live") + "?dashboard=1").json()
    assert live["dashboard"]["counts"]["workers"] == 1
