"""A handler that does not honour its interrupt is given up: its lease no longer
renewed, the interrupt's outcome recorded, and a django-q2 worker process ended
(jobstate.worker.escalation)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import override_settings

from jobstate import registry, services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import escalation
from jobstate.worker.context import JobContext
from jobstate.worker.outage import Outage
from jobstate.worker.runner import drain
from jobstate.worker.slot import Slot
from jobstate.worker.supervisor import Supervisor
from tests.watchdog_support import FakeClock, fake_clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock(monkeypatch: Any) -> FakeClock:
    return fake_clock(monkeypatch)


FAST = {"HEARTBEAT_SECONDS": 0.2, "INTERRUPT_GRACE_SECONDS": 0.5, "CANCEL_GRACE_SECONDS": 0.3}


@pytest.fixture
def exits(monkeypatch):  # type: ignore[no-untyped-def]
    """``os._exit`` of the escalation, recorded instead of made."""
    calls: list[int] = []
    monkeypatch.setattr(escalation, "os", SimpleNamespace(_exit=calls.append))
    return calls


def _watchdog() -> Supervisor:
    """A Supervisor's watchdog decisions, without its threads."""
    sup = object.__new__(Supervisor)
    sup.busy_since = None
    sup.bounded_waits = False
    sup.watch_wake = threading.Event()
    return sup


def _running(temp_handler: Any, *, ends_process: bool, cancel: bool = False) -> Slot:
    """A job begun by this worker, as its watchdog sees it (timeout 1 s)."""
    temp_handler("t.deaf", lambda ctx: None, timeout=1, max_attempts=1)
    services.enqueue("t.deaf", {})
    (job,) = services.claim("w1", start=True)
    if cancel:
        services.request_cancel(job.pk, "api", "stop it")
    ctx = JobContext(job, registry.all_handlers()["t.deaf"], "w1:1")
    ctx.lease_until = float("inf")  # the heartbeat renews it (it is not what is tested here)
    return Slot(ctx, 1, interruptible=False, ends_process=ends_process)


@override_settings(JOBSTATE=FAST)
@pytest.mark.parametrize("ends_process", [True, False], ids=["worker-process", "inline"])
def test_a_timeout_not_honoured_is_recorded_and_ends_a_worker_process(
    temp_handler, clock, exits, caplog, ends_process
):
    sup, slot = _watchdog(), _running(temp_handler, ends_process=ends_process)
    clock.now += 1
    sup._watch(slot)
    assert slot.interrupted == "timeout" and not slot.given_up
    clock.now += 0.4
    sup._watch(slot)
    assert not slot.given_up and exits == []  # it still has time to honour it
    caplog.set_level(logging.ERROR, logger="jobstate")
    clock.now += 0.1
    sup._watch(slot)
    assert slot.given_up and slot.escalated.is_set() and slot.recorded == "failed"
    job = Job.objects.get(pk=slot.ctx.job.pk)
    assert job.status == Status.FAILED and job.error_type == "Timeout"
    assert job.events.get(transition="fail").actor_label == "worker:w1"  # not the reaper
    assert slot.ctx.lease_lost.is_set()
    (line,) = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert str(job.pk) in line and "t.deaf" in line and "recorded failed" in line and "its timeout" in line
    if ends_process:
        assert exits == [escalation.GIVEN_UP_EXIT] and "this worker process ends" in line
    else:
        assert exits == [] and "the handler is still running" in line


@override_settings(JOBSTATE=FAST)
def test_a_process_that_ends_tells_attempt_ended_once_and_flushes_its_logs_first(
    temp_handler, clock, monkeypatch
):
    # os._exit skips run_job's ending: attempt_ended was never told (a span left open)
    # and buffered log handlers (a log shipper) never flushed.
    from jobstate import hooks

    seen: list[tuple[str, Any]] = []
    monkeypatch.setattr(escalation, "os", SimpleNamespace(_exit=lambda code: seen.append(("exit", code))))

    class Buffered(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            pass

        def flush(self) -> None:
            seen.append(("flush", None))

    handler = Buffered()
    logging.getLogger("jobstate").addHandler(handler)

    def told(ctx: Any, ended: str) -> None:
        seen.append(("ended", ended))

    hooks.attempt_ended.register(told)
    try:
        sup, slot = _watchdog(), _running(temp_handler, ends_process=True)
        clock.now += 1
        sup._watch(slot)
        clock.now += 0.5
        sup._watch(slot)
    finally:
        logging.getLogger("jobstate").removeHandler(handler)
        hooks.attempt_ended.unregister(told)
    assert [what for what, _ in seen if what == "ended"] == ["ended"]
    assert ("ended", "failed") in seen and ("flush", None) in seen
    assert seen[-1] == ("exit", escalation.GIVEN_UP_EXIT)


@override_settings(JOBSTATE=FAST)
def test_a_cancel_not_honoured_ends_cancelled(temp_handler, clock, exits):
    sup, slot = _watchdog(), _running(temp_handler, ends_process=True, cancel=True)
    slot.ctx.cancel_seen.set()
    sup._watch(slot)
    clock.now += 0.4
    sup._watch(slot)
    assert slot.interrupted == "cancel"
    clock.now += 0.5
    sup._watch(slot)
    assert slot.recorded == "cancelled" and exits == [escalation.GIVEN_UP_EXIT]
    assert Job.objects.get(pk=slot.ctx.job.pk).status == Status.CANCELLED


@override_settings(JOBSTATE=FAST)
def test_a_lost_lease_not_honoured_records_nothing_and_ends_the_process(temp_handler, clock, exits):
    sup, slot = _watchdog(), _running(temp_handler, ends_process=True)
    slot.ctx.lease_lost.set()
    sup._watch(slot)
    assert slot.interrupted == "lease"
    clock.now += 0.5
    sup._watch(slot)
    assert slot.given_up and slot.recorded == "lost" and exits == [escalation.GIVEN_UP_EXIT]
    assert Job.objects.get(pk=slot.ctx.job.pk).status == Status.PROCESSING  # the reaper's


@override_settings(JOBSTATE=FAST)
def test_a_handler_that_returned_in_time_is_not_given_up(temp_handler, clock, exits):
    sup, slot = _watchdog(), _running(temp_handler, ends_process=True)
    clock.now += 1
    sup._watch(slot)
    slot.done.set()
    clock.now += 5
    escalation.give_up(slot)
    assert not slot.given_up and exits == []
    assert Job.objects.get(pk=slot.ctx.job.pk).status == Status.PROCESSING  # the runner writes it


@override_settings(JOBSTATE=FAST)
def test_the_heartbeat_no_longer_renews_a_given_up_handler(temp_handler, monkeypatch):
    slot = _running(temp_handler, ends_process=False)
    beats: list[Any] = []
    monkeypatch.setattr(services, "heartbeat", lambda *args, **kwargs: beats.append(args))
    sup = object.__new__(Supervisor)
    sup._generation, sup.identity, sup.slot = 1, None, slot
    sup.bounded_waits, sup.renewed = False, 0
    sup._job_outage = Outage(logging.getLogger("jobstate"), "test")
    slot.given_up = True
    slot.next_beat = 0.0  # due
    sup._heartbeat(1)
    assert beats == []


@override_settings(JOBSTATE=FAST)
def test_a_handler_swallowing_its_timeout_inline_ends_failed_while_it_runs_on(temp_handler, caplog):
    # Inline (drain): no process ends; the job is recorded as timed out while the
    # handler still runs, and what it returns later is discarded.
    finished: list[float] = []

    def swallows(ctx):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            try:  # noqa: SIM105 - no suppress(): a signal may land in its own frames
                time.sleep(0.05)
            except BaseException:  # deaf to every interrupt, on purpose
                pass
        finished.append(time.time())
        return {"late": True}

    temp_handler("t.swallows", swallows, timeout=0.5, max_attempts=1)
    job = services.enqueue("t.swallows", {})
    caplog.set_level(logging.ERROR, logger="jobstate")
    assert drain() == 1
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "Timeout" and job.result is None
    (given_up,) = [r for r in caplog.records if "given up" in r.getMessage()]
    assert "the handler is still running" in given_up.getMessage()
    assert given_up.created < finished[0]
