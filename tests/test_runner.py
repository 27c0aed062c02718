"""The runner in-process: outcomes, retries, cancellation, timeouts."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from django_q.exceptions import TimeoutException

from jobstate import NonRetryable, Partial, hooks, services
from jobstate.exceptions import CancelRequested, LeaseLost
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import runner
from jobstate.worker.runner import drain, run_job
from jobstate.worker.slot import INTERRUPT_SIGNAL, HandlerCall, Slot
from jobstate.worker.supervisor import Supervisor, supervisor

pytestmark = pytest.mark.django_db(transaction=True)


def test_completed_with_progress_and_asset(temp_handler, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path

    def build(ctx):
        ctx.progress(50, "half")
        ctx.add_asset("report", b"a,b\n1,2\n", name="out.csv")
        return {"rows": 1}

    temp_handler("t.build", build)
    job = services.enqueue("t.build", {})
    assert drain() == 1
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"rows": 1}
    asset = job.assets.get()
    assert asset.content_type == "text/csv" and asset.size == 8


def test_exception_retries_then_fails(temp_handler):
    def boom(ctx):
        raise ValueError(f"bad {ctx.attempt}")

    temp_handler("t.boom", boom, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.boom", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_message == "bad 2" and job.error_type == "ValueError"
    assert "ValueError" in job.traceback
    assert list(job.events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "requeue",
        "claim",
        "fail",
    ]


@pytest.mark.parametrize(
    ("backoff", "delay"),
    [
        (lambda attempt: 1e30, 366 * 24 * 3600.0),  # past the year 9999: a year
        (lambda attempt: float("inf"), 366 * 24 * 3600.0),
        (lambda attempt: float("nan"), 0.0),
        (lambda attempt: -5, 0.0),
        (lambda attempt: 1 / 0, None),  # raises: the default backoff
        (lambda attempt: "soon", None),  # no number: the default backoff
    ],
)
def test_a_retry_backoff_callable_out_of_bounds_still_records_the_retry(temp_handler, backoff, delay):
    def boom(ctx):
        raise ValueError("bad")

    temp_handler("t.boom", boom, max_attempts=2, retry_backoff=backoff)
    job = services.enqueue("t.boom", {})
    before = timezone.now()
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1") == "retrying"
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.attempts == 1
    waited = (job.run_after - before).total_seconds()
    if delay is None:  # RETRY_BACKOFF_BASE (5 s) and its jitter
        assert 4 <= waited <= 20
    else:
        assert delay - 5 <= waited <= delay + 5


def test_non_retryable_and_partial(temp_handler):
    def nope(ctx):
        raise NonRetryable("no point")

    def half(ctx):
        raise Partial("2 of 3 files", result={"done": 2})

    temp_handler("t.nope", nope, max_attempts=5)
    temp_handler("t.half", half)
    a = services.enqueue("t.nope", {})
    b = services.enqueue("t.half", {})
    drain()
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.status == Status.FAILED and a.attempts == 1
    assert b.status == Status.PARTIAL and b.result == {"done": 2} and b.error_message == "2 of 3 files"


def test_cooperative_cancel(temp_handler):
    def slow(ctx):
        services.request_cancel(ctx.job.pk, "api", "changed my mind")
        ctx.progress(10)
        raise AssertionError("progress should have raised CancelRequested")

    temp_handler("t.slow", slow)
    job = services.enqueue("t.slow", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


@override_settings(JOBSTATE={"CANCEL_GRACE_SECONDS": 0.5, "HEARTBEAT_SECONDS": 0.2})
def test_ignored_cancel_is_stopped_after_grace(temp_handler):
    def stubborn(ctx):
        services.request_cancel(ctx.job.pk, "api")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except Exception as exc:  # a handler that swallows everything still gets stopped
                del exc
        raise AssertionError("not interrupted")

    temp_handler("t.stubborn", stubborn)
    job = services.enqueue("t.stubborn", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_timeout_fails_the_attempt(temp_handler):
    def forever(ctx):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.05)

    temp_handler("t.forever", forever, timeout=0.5, max_attempts=1)
    job = services.enqueue("t.forever", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "Timeout"


def test_unknown_handler_fails_without_retry():
    job = services.enqueue("test.echo", {})
    Job.objects.filter(pk=job.pk).update(kind="gone.away")
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "UnknownKind"


def test_stale_worker_result_is_discarded(temp_handler):
    def taken_away(ctx):
        services.requeue(ctx.job.pk, "admin", "operator took it back")
        return {"late": True}

    temp_handler("t.taken", taken_away)
    job = services.enqueue("t.taken", {})
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1") == "lost"
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.result is None


def test_cancel_requested_raises_in_check(temp_handler):
    seen = {}

    def checker(ctx):
        assert not ctx.cancel_requested
        services.request_cancel(ctx.job.pk, "api")
        try:
            ctx.check_cancelled()
        except CancelRequested:
            seen["raised"] = True
            raise

    temp_handler("t.check", checker)
    job = services.enqueue("t.check", {})
    drain()
    job.refresh_from_db()
    assert seen == {"raised": True} and job.status == Status.CANCELLED


# -- a cancel request wins over every failure or interrupt --------------------


def _cancelled_by_worker(job: Job) -> bool:
    return list(job.events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "request_cancel",
        "cancel",
    ]


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2, "CANCEL_GRACE_SECONDS": 30})
def test_timeout_after_a_cancel_request_ends_cancelled(temp_handler):
    def deaf(ctx):
        services.request_cancel(ctx.job.pk, "api", "stop it")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # times out long before the cancel grace ends
            time.sleep(0.05)

    temp_handler("t.deaf", deaf, timeout=0.5, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.deaf", {})
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1") == "cancelled"
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 1 and _cancelled_by_worker(job)
    assert "Timeout" in job.events.get(transition="cancel").reason


@pytest.mark.parametrize("error", [ValueError("bad input"), NonRetryable("no point")])
def test_failure_after_a_cancel_request_ends_cancelled(temp_handler, error):
    def fails(ctx):
        services.request_cancel(ctx.job.pk, "api", "stop it")
        raise error

    temp_handler("t.fails", fails, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.fails", {})
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1") == "cancelled"
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 1 and _cancelled_by_worker(job)
    cancel = job.events.get(transition="cancel")
    assert type(error).__name__ in cancel.reason and str(error) in cancel.reason
    assert cancel.actor_label == "worker:w1"


def test_handler_that_returns_after_a_cancel_request_completes(temp_handler):
    def finishes(ctx):
        services.request_cancel(ctx.job.pk, "api", "too late")
        return {"done": True}

    def partial(ctx):
        services.request_cancel(ctx.job.pk, "api", "too late")
        raise Partial("half done", result={"done": 1})

    temp_handler("t.finishes", finishes)
    temp_handler("t.partial", partial)
    done = services.enqueue("t.finishes", {})
    half = services.enqueue("t.partial", {})
    drain()
    done.refresh_from_db()
    half.refresh_from_db()
    # Its work is done: the result is kept rather than thrown away.
    assert done.status == Status.COMPLETED and done.result == {"done": True}
    assert half.status == Status.PARTIAL and half.result == {"done": 1}


# -- an interrupt that lands after the handler returned -----------------------


def test_an_interrupt_landing_after_the_handler_returned_is_ignored(temp_handler):
    """The heartbeat's interrupt reaches the main thread just after the handler
    returned: the result stands (it used to be recorded as a timeout and the job
    run again)."""
    landed_inside: list[int] = []
    senders: list[threading.Thread] = []

    def send_interrupt(slot: Slot, ready: threading.Event) -> None:
        ready.wait(10)
        # What the watchdog's interrupt() does, without its logging (which could
        # let the main thread run on before the signal is sent).
        slot.interrupted = "timeout"
        signal.pthread_kill(slot.main_ident, INTERRUPT_SIGNAL)

    def finishing(ctx):
        ready = threading.Event()
        sender = threading.Thread(target=send_interrupt, args=(supervisor().slot, ready))
        senders.append(sender)
        sender.start()
        base, exponent = 3, 600_000
        try:
            ready.set()
            # One bytecode holding the GIL for tens of milliseconds with no
            # eval-breaker check: the sender thread asks for the GIL meanwhile
            # and gets it (and sends the signal) at the first check after the
            # handler returned.
            base**exponent
        except BaseException:
            landed_inside.append(ctx.attempt)  # too early this time: try again
            raise
        return {"attempt": ctx.attempt}

    temp_handler("t.finishing", finishing, max_attempts=1)
    # Should a signal come after run_job restored the previous handler, this one
    # keeps it from killing the test process (SIGUSR1's default action).
    previous = signal.signal(INTERRUPT_SIGNAL, lambda signum, frame: None)
    try:
        for _ in range(5):
            landed_inside.clear()
            job = services.enqueue("t.finishing", {})
            (claimed,) = services.claim("w1")
            outcome = run_job(claimed, "w1")
            for sender in senders:
                sender.join(10)
            if not landed_inside:
                break
    finally:
        signal.signal(INTERRUPT_SIGNAL, previous)
    assert not landed_inside, "the interrupt never landed after the handler returned"
    job.refresh_from_db()
    assert outcome == "completed" and job.status == Status.COMPLETED and job.result == {"attempt": 1}
    # One heartbeat and one watchdog for the process, not a thread per job.
    assert sorted(t.name for t in threading.enumerate() if t.name.startswith("jobstate-")) == [
        "jobstate-heartbeat",
        "jobstate-watchdog",
    ]


def test_interrupts_land_only_inside_the_handler():
    frames = {}

    def handler(ctx):
        frames["handler"] = sys._getframe()
        frames["call"] = sys._getframe(1)
        return "done"

    call = HandlerCall(handler, slot=SimpleNamespace(interrupted=None))  # type: ignore[arg-type]
    assert call.in_handler(sys._getframe()) is False  # not started: not ours either
    assert call(None) == "done"  # type: ignore[arg-type]
    assert call.in_handler(frames["handler"]) is True
    # Back in the calling frame: the handler has returned, too late to interrupt.
    assert call.in_handler(frames["call"]) is False
    assert call.in_handler(sys._getframe()) is False


@pytest.mark.parametrize("opens", ["atomic", "autocommit", "begin"])
def test_a_transaction_the_handler_left_open_is_rolled_back_and_fails_the_job(temp_handler, opens):
    # "begin": a raw BEGIN, unknown to Django. The outcome was written inside it and
    # "completed" returned, never committed; on SQLite every later write of the
    # process failed ("cannot start a transaction within a transaction").
    def leaves_open(ctx):
        if opens == "atomic":
            transaction.atomic().__enter__()  # never exited
        elif opens == "autocommit":
            transaction.set_autocommit(False)  # never committed
        else:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")  # never ended
        Job.objects.filter(pk=ctx.job.pk).update(priority=7)
        return {"done": True}

    temp_handler("t.open", leaves_open, max_attempts=3)
    job = services.enqueue("t.open", {})
    (claimed,) = services.claim("w1")
    # Its outcome was written inside that transaction, never committed (nor was
    # anything this worker process wrote after it).
    assert run_job(claimed, "w1") == "failed"
    assert not connection.in_atomic_block and connection.get_autocommit()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "TransactionLeftOpen" and job.attempts == 1
    assert job.priority != 7 and job.result is None
    # The next job on this connection is written as usual.
    temp_handler("t.fine", lambda ctx: {"ok": 1})
    services.enqueue("t.fine", {})
    assert drain() == 1
    assert Job.objects.get(kind="t.fine").status == Status.COMPLETED


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60})
def test_drain_refuses_a_string_for_its_kinds():
    job = services.enqueue("test.echo", {})
    # A string was taken as its characters: nothing ran, drain returned 0.
    with pytest.raises(TypeError, match=r"not a string: kinds=\[.test.echo.\]"):
        drain(kinds="test.echo")  # type: ignore[arg-type]
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert drain(kinds=["test.echo"]) == 1


def test_ctrl_c_in_an_inline_drain_hands_the_job_back_then_is_raised(temp_handler):
    # Ctrl-C stops the drain, not the job: it was recorded as the handler's
    # error, and a job with one attempt ended failed with KeyboardInterrupt.
    calls: list[int] = []

    def interrupted_once(ctx):
        calls.append(ctx.attempt)
        ctx.progress(10, "starting")  # written at once
        ctx.progress(40, "reading")  # pending: written as the job is handed back
        if len(calls) == 1:
            raise KeyboardInterrupt  # what Python's SIGINT handler raises
        return {"done": True}

    temp_handler("t.ctrl_c", interrupted_once, max_attempts=1)
    job = services.enqueue("t.ctrl_c", {})
    with pytest.raises(KeyboardInterrupt):
        drain()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error_type, job.worker_id) == (Status.QUEUED, 0, "", "")
    assert (job.progress, job.progress_message) == (40, "reading")
    requeue = job.events.order_by("id").last()
    assert requeue.transition == "requeue" and requeue.metadata.get("handed_back") is True
    assert requeue.reason.startswith("stopped by Ctrl-C (KeyboardInterrupt)")
    assert drain() == 1 and calls == [1, 1]  # the next run is its first counted attempt
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == (Status.COMPLETED, 1, {"done": True})


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60})
def test_ctrl_c_after_a_cancel_request_hands_the_job_back_with_its_last_progress(temp_handler):
    # The pending report was written before the hand-back, a write a cancel
    # request refuses: the job went back to the queue showing "starting".
    def cancelled_then_interrupted(ctx):
        ctx.progress(10, "starting")  # written at once
        ctx.progress(40, "reading")  # pending: stored with the hand-back
        services.request_cancel(ctx.job.pk, "api", "stop")
        raise KeyboardInterrupt

    temp_handler("t.ctrl_c_cancel", cancelled_then_interrupted)
    job = services.enqueue("t.ctrl_c_cancel", {})
    with pytest.raises(KeyboardInterrupt):
        drain()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.progress, job.progress_message) == (Status.QUEUED, 0, 40, "reading")
    drain()  # the cancel request is honoured before it runs again (it would raise)
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.progress == 40


@pytest.mark.parametrize("committed", [False, True])
@pytest.mark.parametrize("call", ["begin", "complete"])
def test_ctrl_c_outside_the_handler_of_an_inline_run_hands_the_job_back(
    temp_handler, monkeypatch, call, committed
):
    # Ctrl-C in the begin or the outcome write left the job processing until the
    # reaper took it (with its attempt spent); an outcome already committed stays.
    temp_handler("t.ctrl_c_outside", lambda ctx: {"done": True}, max_attempts=1)
    job = services.enqueue("t.ctrl_c_outside", {})
    real = getattr(services, call)

    def interrupted(*args, **kwargs):
        if committed:
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(services, call, interrupted)
    with pytest.raises(KeyboardInterrupt):
        drain()
    job.refresh_from_db()
    if call == "complete" and committed:  # the hand-back, guarded by the lease token, wrote nothing
        assert (job.status, job.attempts, job.result) == (Status.COMPLETED, 1, {"done": True})
        assert job.events.order_by("id").last().transition == "complete"
        return
    assert (job.status, job.attempts, job.worker_id, job.lease_token) == (Status.QUEUED, 0, "", None)
    requeue = job.events.order_by("id").last()
    assert requeue.transition == "requeue" and requeue.metadata.get("handed_back") is True
    monkeypatch.undo()
    assert drain() == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 1)


def test_ctrl_c_after_the_outcome_was_committed_is_no_warning(temp_handler, monkeypatch, caplog):
    # The hand-back's lease guard refusing a job that already ended is that normal race:
    # it was logged as a WARNING "lease token does not match", alarming an operator.
    temp_handler("t.ctrl_c_late", lambda ctx: {"done": True})
    job = services.enqueue("t.ctrl_c_late", {})
    real = services.complete

    def completed_then_interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(services, "complete", completed_then_interrupted)
    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.raises(KeyboardInterrupt):
        drain()
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED
    refused = [r for r in caplog.records if r.getMessage().startswith("Refused requeue")]
    assert [(r.levelno, r.getMessage()) for r in refused] == [
        (logging.INFO, f"Refused requeue on job {job.pk}: it is already completed")
    ]
    # Other callers still warn: a stale token is worth an operator's look there.
    caplog.clear()
    with pytest.raises(LeaseLost):
        services.hand_back(job, uuid.uuid4(), reason="test")
    assert [r.levelno for r in caplog.records if r.getMessage().startswith("Refused")] == [logging.WARNING]


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_base_exception_from_the_handler_is_recorded_then_raised(temp_handler, error):
    def leaves(ctx):
        raise error

    temp_handler("t.leaves", leaves, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.leaves", {})
    (claimed,) = services.claim("w1")
    with pytest.raises(type(error)):
        run_job(claimed, "w1")  # a worker process then exits
    job.refresh_from_db()  # not left processing until its lease runs out
    assert job.status == Status.QUEUED and job.error_type == type(error).__name__ and job.attempts == 1
    assert type(error).__name__ in job.traceback


def test_a_cancelled_error_from_the_handler_is_its_error_not_an_exit(temp_handler):
    # asyncio.CancelledError is a BaseException: an async handler (or a task) whose
    # coroutine was cancelled left its job processing, charged to a lost worker by the
    # reaper, and the error went on up and ended the worker process.
    async def cancelled(ctx):
        raise asyncio.CancelledError("the awaited task was cancelled")

    temp_handler("t.cancelled", lambda ctx: async_to_sync(cancelled)(ctx), max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.cancelled", {})
    assert drain("w1") == 2
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "CancelledError" and job.attempts == 2
    assert "asyncio.exceptions.CancelledError: the awaited task was cancelled" in job.traceback


@pytest.fixture
def told():  # type: ignore[no-untyped-def]
    """What the attempt_ended hook was told, in order."""
    outcomes: list[str] = []

    def ended(ctx: object, outcome: str) -> None:
        outcomes.append(outcome)

    hooks.attempt_ended.register(ended)
    yield outcomes
    hooks.attempt_ended.unregister(ended)


EXITS = [
    pytest.param(TimeoutException("Task exceeded maximum timeout value"), False, id="hard-limit"),
    pytest.param(SystemExit(3), False, id="SystemExit"),
    pytest.param(KeyboardInterrupt(), False, id="KeyboardInterrupt"),
    pytest.param(KeyboardInterrupt(), True, id="ctrl-c-inline"),
    pytest.param(GeneratorExit(), False, id="GeneratorExit"),
    pytest.param(asyncio.CancelledError(), False, id="CancelledError"),
]


@pytest.mark.parametrize("where", ["attempt_started", "registration"])
@pytest.mark.parametrize(("error", "inline"), EXITS)
def test_an_exit_between_the_slot_s_registration_and_the_handler_ends_the_attempt_and_its_slot(
    temp_handler, monkeypatch, told, error, inline, where
):
    # It escaped before the handler's try: the slot stayed registered (the heartbeat
    # renewed the lease of a job nothing ran, the watchdog timed it out), the job stayed
    # processing until the reaper, and attempt_ended was never told.
    ran: list[object] = []
    temp_handler("t.exits", ran.append, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.exits", {})
    (claimed,) = services.claim("w1")

    def exits(*args: object) -> None:
        raise error

    if where == "registration":  # raised once the slot is registered, before the hook
        real_begin = Supervisor.begin

        def begin_then_exit(self: Supervisor, slot: Slot) -> None:
            real_begin(self, slot)
            raise error

        monkeypatch.setattr(Supervisor, "begin", begin_then_exit)
    else:
        hooks.attempt_started.register(exits)
    try:
        with pytest.raises(type(error)):
            run_job(claimed, "w1", inline=inline)
    finally:
        hooks.attempt_started.unregister(exits)
    assert supervisor().slot is None and ran == []
    job.refresh_from_db()
    if isinstance(error, TimeoutException):
        # As when django-q2's hard limit fires in the handler.
        assert (job.status, job.attempts, job.error_type) == (Status.QUEUED, 1, "HardTimeout")
        ended = "retrying"
    elif inline and isinstance(error, KeyboardInterrupt):
        # The operator's Ctrl-C, as in begin: handed back, the attempt refunded.
        assert (job.status, job.attempts, job.error_type) == (Status.QUEUED, 0, "")
        assert job.events.order_by("id").last().metadata.get("handed_back") is True
        ended = "interrupted"
    else:
        # As when the handler raises it: retried with the error, the attempt charged.
        assert (job.status, job.attempts, job.error_type) == (Status.QUEUED, 1, type(error).__name__)
        assert job.error_message.startswith("the handler could not be started: ")
        ended = "retrying"
    # Told only of an attempt it was told had started.
    assert told == ([ended] if where == "attempt_started" else [])
    monkeypatch.undo()
    assert drain() == 1 and len(ran) == 1  # the next run is undisturbed


@pytest.mark.parametrize(
    "error", [SystemExit(1), KeyboardInterrupt(), GeneratorExit(), asyncio.CancelledError()]
)
def test_an_attempt_started_function_that_exits_every_time_is_bounded_by_max_attempts(temp_handler, error):
    # Each exit may end a django-q2 worker process. Refunded, the job was claimed
    # again and again, ending a worker each time: max_attempts never stopped it.
    ran: list[object] = []
    temp_handler("t.poison", ran.append, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.poison", {})

    def exits(ctx: object) -> None:
        raise error

    runs = 0
    hooks.attempt_started.register(exits)
    try:
        while claimed := services.claim("w1"):
            assert runs < 2, job.attempts
            runs += 1
            with pytest.raises(type(error)):
                run_job(claimed[0], "w1")
    finally:
        hooks.attempt_started.unregister(exits)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error_type, ran) == (Status.FAILED, 2, type(error).__name__, [])
    assert runs == 2


def test_an_exit_in_the_outcome_write_tells_attempt_ended_the_attempt_is_lost(
    temp_handler, monkeypatch, told
):
    # django-q2's hard limit fired as the outcome was written (the task records it):
    # attempt_ended was never told, and a tracing span stayed open until the next attempt.
    def hard_limit(*args: object, **kwargs: object) -> str:
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.quick", lambda ctx: None)
    services.enqueue("t.quick", {})
    (claimed,) = services.claim("w1")
    monkeypatch.setattr(runner, "finish", hard_limit)
    with pytest.raises(TimeoutException):
        run_job(claimed, "w1")
    assert told == ["lost"] and supervisor().slot is None
