"""A worker whose own clock is off writes leases that run ``LEASE_SECONDS`` by the
database's clock (PostgreSQL), the clock the reaper judges them by: a healthy job
is never rescued, and run twice at once, because its worker's clock runs behind."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobstate import conf, services
from jobstate.models import Job
from jobstate.states import Status

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite is one machine: one clock for workers and reaper"
    ),
]

ME = "host:1:2"
SKEWS = [timedelta(minutes=-10), timedelta(minutes=10)]


@pytest.fixture(params=SKEWS, ids=["behind", "ahead"])
def skewed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> timedelta:
    """This process's clock (the worker's and the services'), off by 10 minutes."""
    real = timezone.now
    skew: timedelta = request.param

    def now() -> datetime:
        return real() + skew

    monkeypatch.setattr(timezone, "now", now)
    return skew


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        value: datetime = cursor.fetchone()[0]
    return value


def assert_by_the_database_clock(job: Job, lease_seconds: float | None = None) -> None:
    """The stored lease is the database's now + the lease (within a second), the
    heartbeat the database's now; both in the row and in what the service returned."""
    now = database_now()
    lease = timedelta(seconds=lease_seconds or float(conf.get("LEASE_SECONDS")))
    expires, beat = Job.objects.values_list("lease_expires_at", "heartbeat_at").get(pk=job.pk)
    assert abs(expires - (now + lease)) < timedelta(seconds=1), (expires, now)
    assert abs(beat - now) < timedelta(seconds=1), (beat, now)


def assert_not_reaped(job: Job) -> None:
    report = services.requeue_expired()
    assert report.total == 0
    assert Job.objects.values_list("status", flat=True).get(pk=job.pk) == Status.PROCESSING


def test_a_claimed_job_is_leased_by_the_database_clock_and_left_alone_while_it_heartbeats(skewed):
    services.enqueue("test.echo", {})
    (job,) = services.claim("host:1")
    assert_by_the_database_clock(job)
    assert abs(job.lease_expires_at - Job.objects.get(pk=job.pk).lease_expires_at) < timedelta(microseconds=1)
    assert_not_reaped(job)
    assert services.extend_leases("host:1", [(job.pk, job.lease_token)]) == 1
    assert_by_the_database_clock(job)
    begun = services.begin(job, job.lease_token, ME).job
    assert_by_the_database_clock(begun)
    # Past the prepared statements' threshold (project settings: 5): the same
    # statements, prepared, keep computing the lease in the database.
    for _ in range(7):
        services.heartbeat(job, job.lease_token)
        assert_by_the_database_clock(job)
        assert_not_reaped(job)
    for percent in range(7):
        services.report_progress(job, job.lease_token, percent)
        assert_by_the_database_clock(job)
    assert_not_reaped(job)


def test_claimed_and_begun_in_one_statement(skewed):
    services.enqueue("test.echo", {})
    (job,) = services.claim(ME, start=True, lease_seconds=120)
    assert_by_the_database_clock(job, 120)
    assert_not_reaped(job)


def test_started_by_id(skewed):
    job = services.enqueue("test.echo", {})
    started = services.start(job, ME)
    assert_by_the_database_clock(started)
    assert abs(started.lease_expires_at - Job.objects.get(pk=job.pk).lease_expires_at) < timedelta(seconds=1)
    assert_not_reaped(job)


def test_the_job_claimed_with_an_outcome(skewed):
    services.enqueue("test.echo", {"n": 0})
    (done,) = services.claim(ME, start=True)
    services.enqueue("test.echo", {"n": 1})
    then = services.NextClaim(ME, ["test.echo"])
    services.complete(done, done.lease_token, None, then=then)
    (following,) = then.claimed
    assert_by_the_database_clock(following)
    assert_not_reaped(following)


@pytest.mark.parametrize(
    "write",
    [
        lambda job, now: services.heartbeat(job, job.lease_token, now=now),
        lambda job, now: services.report_progress(job, job.lease_token, 5, now=now),
    ],
    ids=["heartbeat", "progress"],
)
def test_a_callers_explicit_now_is_still_written(write: Callable[[Job, datetime], object]):
    services.enqueue("test.echo", {})
    (job,) = services.claim(ME, start=True)
    at = timezone.now() - timedelta(hours=1)
    write(job, at)
    row = Job.objects.get(pk=job.pk)
    assert (row.lease_expires_at, row.heartbeat_at) == (
        at + timedelta(seconds=float(conf.get("LEASE_SECONDS"))),
        at,
    )
