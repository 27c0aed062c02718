"""A worker process that is hung or cut off, not dead: its handler is stopped
before its lease runs out, so that the job the reaper requeues then never runs
twice at once (docs/explanation/workers.md, "A hung or partitioned worker")."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from jobstate import conf, services
from jobstate.models import Job
from jobstate.registry import HandlerSpec
from jobstate.states import Status
from jobstate.worker.context import JobContext
from jobstate.worker.runner import run_job
from jobstate.worker.slot import Slot
from jobstate.worker.supervisor import Supervisor
from tests.watchdog_support import FakeClock, fake_clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock(monkeypatch: Any) -> FakeClock:
    return fake_clock(monkeypatch)


# The most the checks allow: a heartbeat at half the lease.
HALF = {"HEARTBEAT_SECONDS": 2, "LEASE_SECONDS": 4}


def _watchdog(bounded_waits: bool) -> Supervisor:
    """A Supervisor's watchdog decisions, without its threads."""
    sup = object.__new__(Supervisor)
    sup.busy_since = None
    sup.bounded_waits = bounded_waits
    sup.watch_wake = threading.Event()
    return sup


def _slot(clock: FakeClock) -> Slot:
    job = Job(kind="t.watched", lease_token=uuid.uuid4())
    ctx = JobContext(job, HandlerSpec("t.watched", lambda ctx: None), "w1:1")
    ctx.lease_until = clock.now + 4  # renewed just now
    return Slot(ctx, 3600, interruptible=False)


@override_settings(JOBSTATE=HALF)
def test_a_heartbeat_call_that_hangs_gives_the_lease_up_before_it_runs_out(clock):
    # The renewal after the last one hangs (a server that stopped answering: no
    # RST, so it waits for the TCP timeout). The reaper may requeue the job once
    # the lease runs out: the handler is stopped before, on this process's clock.
    sup, slot = _watchdog(bounded_waits=True), _slot(clock)
    clock.now += 2
    sup.busy_since = clock.now  # the next beat, in flight from now on
    clock.now += 0.9
    sup._watch(slot)
    assert slot.interrupted is None  # the lease still has 1.1 s, more than the margin
    clock.now += 0.2
    sup._watch(slot)
    assert slot.ctx.lease_lost.is_set() and slot.interrupted == "lease"
    assert clock.now < slot.ctx.lease_until  # before another worker can have it


@override_settings(JOBSTATE=HALF)
def test_a_heartbeat_waiting_on_a_lock_keeps_the_lease_past_its_end(clock):
    # The beat before ended in a lock wait (the handler's own transaction holds the
    # row, say): whoever holds the row holds off the reaper too.
    sup, slot = _watchdog(bounded_waits=True), _slot(clock)
    slot.blocked = True
    sup.busy_since = clock.now + 5
    clock.now += 5.5
    sup._watch(slot)
    assert slot.interrupted is None
    clock.now += 4  # but a call that never returns is not a lock wait
    sup._watch(slot)
    assert slot.interrupted == "lease"


@override_settings(JOBSTATE=HALF)
def test_on_sqlite_a_heartbeat_call_in_flight_is_a_lock_wait_the_reaper_shares(clock):
    sup, slot = _watchdog(bounded_waits=False), _slot(clock)
    sup.busy_since = clock.now + 2
    clock.now += 10
    sup._watch(slot)
    assert slot.interrupted is None


@override_settings(JOBSTATE=HALF)
def test_a_failing_heartbeat_gives_the_lease_up_a_margin_before_it_runs_out(clock):
    sup, slot = _watchdog(bounded_waits=True), _slot(clock)
    clock.now += 2.9
    sup._watch(slot)
    assert slot.interrupted is None
    clock.now += 0.2
    sup._watch(slot)
    assert slot.interrupted == "lease"


@override_settings(JOBSTATE=HALF)
def test_a_handler_whose_heartbeat_hangs_is_stopped_before_its_lease_runs_out(temp_handler, hung_heartbeat):
    alive: list[float] = []
    leases: list[JobContext] = []

    def long(ctx):  # type: ignore[no-untyped-def]
        leases.append(ctx)
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            alive.append(time.monotonic())
            time.sleep(0.02)
        return {"ran": True}

    temp_handler("t.hung_long", long, max_attempts=2)
    job = services.enqueue("t.hung_long", {})
    (claimed,) = services.claim("w1")
    outcome = run_job(claimed, "w1:1")
    job.refresh_from_db()
    assert hung_heartbeat.is_set()
    if connection.vendor == "postgresql":
        assert outcome == "lost" and job.status == Status.PROCESSING  # the reaper's to requeue
        # Stopped with a second of the lease left (the margin), not once the
        # stuck call was taken for a hang, two seconds after it ran out.
        assert alive[-1] < leases[0].lease_until
    else:  # every wait is a lock wait on the file the reaper shares
        assert outcome == "completed"


@override_settings(JOBSTATE=HALF)
def test_a_process_resumed_after_a_pause_past_its_lease_stops_its_handler_at_once(clock, caplog):
    # SIGSTOP, a long GC pause, a frozen VM: every thread stopped, the clock did not.
    sup, slot = _watchdog(bounded_waits=True), _slot(clock)
    clock.now += 3600
    sup._watch(slot)
    assert slot.interrupted == "lease"
    # The database may well have been reachable all along: the log does not say otherwise.
    (said,) = [r.getMessage() for r in caplog.records if "lease runs out" in r.getMessage()]
    assert "could not renew it" in said and "or this process paused" in said
    assert "cannot reach the database" not in said


def test_a_reserved_job_reclaimed_after_its_lease_ran_out_is_not_begun_by_its_first_cluster(temp_handler):
    # The pusher's renewals of a job waiting in django-q2's queue stopped (hung), the
    # lease ran out, the reaper requeued it and another cluster began it. The first
    # cluster's worker process then takes its package: begin's guarded UPDATE (this
    # lease token, not begun) refuses it, and the handler never runs.
    calls: list[str] = []
    temp_handler("t.reserved", lambda ctx: calls.append(ctx.worker_id))
    services.enqueue("t.reserved", {})
    (stale,) = services.claim("first-cluster", lease_seconds=1)
    later = timezone.now() + timedelta(seconds=5)
    assert services.requeue_expired(now=later).requeued == [stale.pk]
    (fresh,) = services.claim("second-cluster", start=True, now=later)
    assert run_job(stale, "first-cluster:1") == "lost"
    assert calls == []
    row = Job.objects.get(pk=stale.pk)
    assert (row.status, row.lease_token, row.worker_id, row.attempts) == (
        Status.PROCESSING,
        fresh.lease_token,
        "second-cluster",
        1,
    )


@pytest.mark.parametrize("skew", [timedelta(minutes=-10), timedelta(minutes=10)], ids=["behind", "ahead"])
def test_the_watchdog_counts_the_lease_from_the_write_that_began_it_not_the_stored_expiry(
    temp_handler, monkeypatch, skew
):
    # On PostgreSQL the stored expiry is on the database's clock; read against this
    # machine's clock, 10 minutes behind, it would give the watchdog 10 minutes more
    # than the lease (two runs at once); 10 minutes ahead, a lease already over.
    seen: list[tuple[float, float]] = []
    temp_handler("t.counted", lambda ctx: seen.append((ctx.lease_until, time.monotonic())))
    services.enqueue("t.counted", {})
    (claimed,) = services.claim("w1")
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + skew)
    before = time.monotonic()
    assert run_job(claimed, "w1:1") == "completed"
    ((lease_until, started),) = seen
    lease = float(conf.get("LEASE_SECONDS"))
    assert before + lease <= lease_until <= started + lease


def test_a_context_counts_from_when_its_lease_was_written():
    expired = Job(
        kind="t.watched", lease_token=uuid.uuid4(), lease_expires_at=timezone.now() - timedelta(hours=1)
    )
    spec = HandlerSpec("t.watched", lambda ctx: None)
    lease = float(conf.get("LEASE_SECONDS"))
    assert JobContext(expired, spec, "w1:1", leased_at=123.0).lease_until == 123.0 + lease
    before = time.monotonic()
    assert before + lease <= JobContext(expired, spec, "w1:1").lease_until <= time.monotonic() + lease
