"""Each cluster process measures its clock against the database's at its process
beat (PostgreSQL), warns once per change of side past a quarter of
HEARTBEAT_SECONDS, and stores the offset on its WorkerProcess row."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import override_settings

from jobstate.models import WorkerProcess
from jobstate.worker import clock
from jobstate.worker.clock import ClockWatch

POSTGRES = connection.vendor == "postgresql"


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "jobstate" and r.levelno >= logging.WARNING]


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 10})  # limit: 2.5 s
def test_the_offset_is_taken_at_the_midpoint_of_the_call():
    watch = ClockWatch()
    watch.measured(1000.0, None, 1000.2, "h:1:2")  # SQLite, a first beat: nothing to tell
    assert watch.offset is None
    watch.measured(1000.0, at(998.9), 1000.2, "h:1:2")
    assert watch.offset == pytest.approx(1.2)
    watch.measured(1000.0, at(1003.1), 1003.0, "h:1:2")  # too slow a round trip: kept as it was
    assert watch.offset == pytest.approx(1.2)


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 10})
def test_one_warning_per_change_of_side_not_one_per_beat(caplog):
    caplog.set_level(logging.INFO, logger="jobstate")
    watch = ClockWatch()
    for _ in range(3):
        watch.measured(1000.0, at(1005.0), 1000.0, "h:1:2")  # 5 s behind
    (behind,) = warnings(caplog)
    assert "process h:1:2 is 5.00 s behind the database's" in behind
    assert "retries it schedules run that much sooner" in behind
    caplog.clear()
    for _ in range(3):
        watch.measured(1000.0, at(996.0), 1000.0, "h:1:2")  # 4 s ahead
    (ahead,) = warnings(caplog)
    assert "is 4.00 s ahead of the database's" in ahead and "wait that much longer" in ahead
    caplog.clear()
    watch.measured(1000.0, at(1000.1), 1000.0, "h:1:2")
    assert not warnings(caplog)
    assert [r.getMessage() for r in caplog.records] == [
        "jobstate: the clock of process h:1:2 agrees with the database's again (-0.10 s)"
    ]
    watch.measured(1000.0, at(996.0), 1000.0, "h:1:2")
    assert len(warnings(caplog)) == 1  # past the limit again: said again


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 10})
def test_a_clock_that_hovers_at_the_limit_warns_once(caplog):
    watch = ClockWatch()
    for offset in (2.6, 2.4, 2.6, 1.3, 2.6):
        watch.measured(1000.0, at(1000.0 - offset), 1000.0, "h:1:2")
    assert len(warnings(caplog)) == 1
    # Past the limit only once the whole uncertainty is: 3 s ahead, within 0.6 s.
    quiet = ClockWatch()
    quiet.measured(1000.0, at(997.6), 1001.2, "h:1:2")
    assert quiet.offset == pytest.approx(3.0) and len(warnings(caplog)) == 1


def shift_wall(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The clock the supervisor and the pusher read, ``seconds`` off from the database's."""
    monkeypatch.setattr(clock, "wall", lambda: time.time() + seconds)


@pytest.mark.django_db
@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 60})  # limit: 15 s
@pytest.mark.parametrize("offset", [-3600.0, 3600.0])
def test_a_worker_process_measures_its_clock_at_its_beat_and_stores_it(monkeypatch, caplog, offset):
    from jobstate.worker.supervisor import supervisor

    sup = supervisor()
    monkeypatch.setattr(sup, "clock", ClockWatch())
    shift_wall(monkeypatch, offset)
    sup._beat_process_as(None, "host:1:7", "host:1")  # inserts the row: nothing returned
    sup._beat_process_as(None, "host:1:7", "host:1")
    row = WorkerProcess.objects.get(name="host:1:7")
    assert row.clock_offset is None  # stored by the beat after the one that measured it
    sup._beat_process_as(None, "host:1:7", "host:1")
    row.refresh_from_db()
    if not POSTGRES:  # one machine: nothing to measure
        assert sup.clock.offset is None and row.clock_offset is None and not warnings(caplog)
        return
    assert sup.clock.offset == pytest.approx(offset, abs=clock.limit())
    assert row.clock_offset == pytest.approx(offset, abs=clock.limit())
    (warned,) = warnings(caplog)
    assert "process host:1:7" in warned and ("behind" if offset < 0 else "ahead of") in warned


@pytest.mark.django_db
@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 60})
def test_the_pusher_measures_its_clock_too(broker, monkeypatch, caplog):
    shift_wall(monkeypatch, -3600.0)
    for _ in range(3):
        broker._renew(time.monotonic())
    row = WorkerProcess.objects.get(role="pusher")
    if not POSTGRES:
        assert row.clock_offset is None and not warnings(caplog)
        return
    assert row.clock_offset == pytest.approx(-3600.0, abs=clock.limit())
    (warned,) = warnings(caplog)
    assert f"process {row.name} is" in warned and "behind" in warned
