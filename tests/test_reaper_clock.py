"""The reaper judges expiry by the database's clock on PostgreSQL (``LeaseClock``),
by this process's clock elsewhere; workers write leases by the same clock
(tests/test_lease_clock.py: a worker whose own clock is off)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobstate import conf, services
from jobstate.models import Job
from jobstate.models.job import LeaseClock
from jobstate.states import Status

pytestmark = pytest.mark.django_db

POSTGRES = connection.vendor == "postgresql"


def shift_clock(monkeypatch: pytest.MonkeyPatch, by: timedelta) -> None:
    """This process's clock, ``by`` off from the real one (the database's)."""
    real = timezone.now

    def shifted() -> datetime:
        return real() + by

    monkeypatch.setattr(timezone, "now", shifted)


def running(lease_left: float) -> Job:
    """A running job whose lease runs out ``lease_left`` seconds from now (real clock)."""
    services.enqueue("test.echo", {})
    (job,) = services.claim("h:1")
    services.begin(job, job.lease_token, "h:1:2")
    services.heartbeat(job, job.lease_token, now=timezone.now() - timedelta(seconds=60 - lease_left))
    return job


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def test_clocks_agreeing_it_takes_the_expired_lease_and_leaves_the_live_one():
    gone, alive = running(-2), running(30)
    report = services.requeue_expired()
    assert report.requeued == [gone.pk]
    assert (status(gone), status(alive)) == (Status.QUEUED, Status.PROCESSING)


def test_a_reaper_clock_ahead_takes_no_healthy_job(monkeypatch):
    job = running(50)
    shift_clock(monkeypatch, timedelta(hours=1))
    report = services.requeue_expired()
    # PostgreSQL: the database's clock, shared by every machine. SQLite (one
    # machine): this process's clock, which says the lease ran out.
    assert (report.total, status(job)) == ((0, Status.PROCESSING) if POSTGRES else (1, Status.QUEUED))


def test_a_reaper_clock_behind_still_takes_an_expired_job(monkeypatch):
    job = running(-2)
    shift_clock(monkeypatch, timedelta(hours=-1))
    report = services.requeue_expired()
    # Found and guarded by the same clock: the guarded UPDATE does not refuse it.
    assert (report.total, status(job)) == ((1, Status.QUEUED) if POSTGRES else (0, Status.PROCESSING))


def test_an_explicit_now_is_still_the_callers():
    job = running(50)
    assert services.requeue_expired(timezone.now() + timedelta(seconds=55)).requeued == [job.pk]


def test_workers_write_leases_by_the_clock_the_reaper_judges_them_by(monkeypatch):
    """Claim, begin, heartbeat and progress write ``lease_expires_at``: on
    PostgreSQL from the database's clock, whatever the worker's says; on SQLite
    (one machine) from this process's clock."""
    services.enqueue("test.echo", {})
    ahead = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: ahead)
    seconds = float(conf.get("LEASE_SECONDS"))

    def written() -> bool:
        lease, now = Job.objects.annotate(now=LeaseClock()).values_list("lease_expires_at", "now").get()
        if POSTGRES:  # the database's clock, read by a statement just after the write
            return abs(lease - (now + timedelta(seconds=seconds))) < timedelta(seconds=1)
        return bool(lease == ahead + timedelta(seconds=seconds))

    (job,) = services.claim("h:1")
    assert written()
    services.begin(job, job.lease_token, "h:1:2")
    assert written()
    services.heartbeat(job, job.lease_token)
    assert written()
    services.report_progress(job, job.lease_token, 10)
    assert written()
