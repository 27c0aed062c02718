"""jobstate.testing: the inline runner as a project's tests use it."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from jobstate import services, testing
from jobstate.exceptions import Suspend
from jobstate.states import TERMINAL, Status

pytestmark = pytest.mark.django_db


def test_progress_kept_for_later_is_written_inside_the_tests_transaction(temp_handler, caplog):
    """Progress calls closer together than PROGRESS_FLUSH_SECONDS were left for the
    heartbeat thread to write, on a connection of its own that cannot see a job
    the test's transaction holds: on PostgreSQL it found no job, and the handler
    was interrupted as if its lease were lost."""

    def slow(ctx: Any) -> dict[str, int]:
        for i in range(1, 4):
            ctx.progress(i * 30, f"part {i}")
        time.sleep(1)  # the kept report comes due while the handler works
        return {"parts": 3}

    temp_handler("t.testing.slow", slow)
    job = services.enqueue("t.testing.slow", {})
    assert connection.in_atomic_block
    assert testing.drain() == 1
    job.refresh_from_db()
    assert (job.status, job.result, job.progress, job.progress_message) == (
        Status.COMPLETED,
        {"parts": 3},
        100,  # completed: 100 %
        "part 3",
    )
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_drain_now_runs_the_jobs_due_by_then(temp_handler):
    temp_handler("t.testing.later", lambda ctx: ctx.parameters)
    soon = services.enqueue("t.testing.later", {"n": 1}, run_after=timezone.now() + timedelta(hours=1))
    late = services.enqueue("t.testing.later", {"n": 2}, run_after=timezone.now() + timedelta(hours=3))
    assert testing.drain() == 0
    assert testing.drain(now=timezone.now() + timedelta(hours=2)) == 1
    soon.refresh_from_db()
    late.refresh_from_db()
    assert (soon.status, late.status) == (Status.COMPLETED, Status.QUEUED)
    assert testing.transitions(soon.pk) == ["enqueue", "claim", "complete"]


def test_drain_takes_kinds_and_a_limit(temp_handler):
    temp_handler("t.testing.a")
    temp_handler("t.testing.b")
    for kind in ("t.testing.a", "t.testing.a", "t.testing.b"):
        services.enqueue(kind, {})
    assert testing.drain(kinds=["t.testing.b"]) == 1
    assert testing.drain(max_jobs=1) == 1
    assert testing.drain() == 1
    with pytest.raises(TypeError, match="not a string"):
        testing.drain(kinds="t.testing.a")  # type: ignore[arg-type]


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 1, "LEASE_SECONDS": 30})
def test_a_handler_longer_than_the_heartbeat_completes_inside_the_tests_transaction(temp_handler):
    # The heartbeat's lease renewal, on a connection of its own, could not see the
    # job: on PostgreSQL it was refused ("lease lost") and the watchdog interrupted
    # the handler, closing the test's connection.
    temp_handler("t.testing.long", lambda ctx: time.sleep(3) or {"ok": 1})
    job = services.enqueue("t.testing.long", {})
    assert connection.in_atomic_block
    assert testing.drain() == 1
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.COMPLETED, {"ok": 1})


def test_drain_now_in_the_past_still_runs_the_jobs_due_now(temp_handler):
    temp_handler("t.testing.now", lambda ctx: {"ok": 1})
    job = services.enqueue("t.testing.now", {})
    assert testing.drain(now=timezone.now() - timedelta(hours=1)) == 1
    job.refresh_from_db()
    assert job.status == Status.COMPLETED


def test_drain_now_reruns_a_handler_that_suspends_past_the_real_clock_until_max_jobs(temp_handler):
    # What the docstring warns of: the handler's clock does not move with ``now``.
    def poll(ctx: Any) -> None:
        raise Suspend("not yet", until=timezone.now() + timedelta(minutes=5))

    temp_handler("t.testing.poll", poll)
    services.enqueue("t.testing.poll", {})
    assert testing.drain() == 1
    assert testing.drain(now=timezone.now() + timedelta(hours=1), max_jobs=7) == 7


@override_settings(JOBSTATE={"INTERRUPT_GRACE_SECONDS": 0.2, "HEARTBEAT_SECONDS": 1, "LEASE_SECONDS": 30})
def test_a_handler_deaf_to_its_timeout_is_not_given_up_inside_the_tests_transaction(temp_handler):
    # Giving it up wrote its outcome on a connection of its own, which cannot see the
    # test's job: on SQLite that waited out the busy timeout twice (a minute).
    def deaf(ctx: Any) -> dict[str, int]:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with contextlib.suppress(BaseException):  # swallows its interrupt, on purpose
                time.sleep(0.05)
        return {"ok": 1}

    temp_handler("t.testing.deaf", deaf, timeout=0.3, max_attempts=1)
    job = services.enqueue("t.testing.deaf", {})
    started = time.monotonic()
    assert testing.drain() == 1
    assert time.monotonic() - started < 10
    job.refresh_from_db()
    assert job.status in TERMINAL
    assert connection.in_atomic_block  # the test's own connection, still open after the interrupt


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 1, "LEASE_SECONDS": 30})
def test_a_handler_that_honours_its_timeout_leaves_the_tests_connection_open(temp_handler):
    # The interrupt's connection clean-up closed the test's own connection: every
    # later query of the test failed ("Cannot operate on a closed database").
    temp_handler("t.testing.slow2", lambda ctx: time.sleep(5), timeout=0.3, max_attempts=1)
    job = services.enqueue("t.testing.slow2", {})
    assert testing.drain() == 1
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.FAILED, "Timeout")
