"""Every way an attempt ends is recorded; claimed is not running; interrupts,
the per-process heartbeat and watchdog, and coalesced progress.

The table of exits is in jobstate/worker/runner.py and docs/explanation/attempts.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.functional import lazy

from jobstate import NonRetryable, Partial, conf, hooks, services
from jobstate.exceptions import CancelRequested, LeaseLost, Suspend
from jobstate.models import Job, WorkerProcess
from jobstate.states import Status
from jobstate.storable import result_value
from jobstate.worker.runner import drain, run_job

pytestmark = pytest.mark.django_db(transaction=True)


def transitions(job: Job) -> list[str]:
    return list(job.events.order_by("id").values_list("transition", flat=True))


def run_one(kind: str, parameters: dict | None = None, **options) -> tuple[str, Job]:  # type: ignore[type-arg]
    job = services.enqueue(kind, parameters or {}, **options)
    (claimed,) = services.claim("w1")
    outcome = run_job(claimed, "w1:1")
    job.refresh_from_db()
    return outcome, job


# -- results that cannot be stored ---------------------------------------------


def test_an_unstorable_result_fails_the_job_with_that_error_and_never_reruns_it(temp_handler):
    calls: list[int] = []

    def returns_a_socket(ctx):
        calls.append(ctx.attempt)
        return {"handle": object()}  # not JSON

    temp_handler("t.unstorable", returns_a_socket, max_attempts=3, retry_backoff=0)
    outcome, job = run_one("t.unstorable")
    assert outcome == "failed" and calls == [1]
    assert job.status == Status.FAILED and job.error_type == "UnstorableResult"
    assert "could not be stored" in job.error_message and "JSON" in job.error_message
    assert transitions(job) == ["enqueue", "claim", "fail"]
    assert drain() == 0 and calls == [1]  # no re-run of its side effects


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        {"ratio": float("-inf")},
        "a\x00b",
        {"k\x00": 1},
        ["ok", {"deep": "\x00"}],
        "name-\udcff",  # os.fsdecode's escape of an undecodable byte
        {"k\ud800": "high surrogate alone"},
    ],
    ids=["nan", "infinity", "nested-infinity", "nul", "nul-in-a-key", "nested-nul", "lone-low", "lone-high"],
)
def test_a_result_the_database_refuses_fails_the_job_and_is_never_rerun(temp_handler, value):
    # json.dumps writes NaN and Infinity, and a string may hold a NUL: PostgreSQL's
    # jsonb refuses both and SQLite's JSON check the first. Caught before the write,
    # the job fails as UnstorableResult instead of being retried as if it had crashed.
    calls: list[int] = []

    def returns(ctx):
        calls.append(ctx.attempt)
        return value

    temp_handler("t.refused_result", returns, max_attempts=3, retry_backoff=0)
    outcome, job = run_one("t.refused_result")
    assert outcome == "failed" and calls == [1]
    assert job.status == Status.FAILED and job.error_type == "UnstorableResult"
    assert transitions(job) == ["enqueue", "claim", "fail"]
    assert drain() == 0 and calls == [1]


def test_a_result_nested_too_deep_fails_the_job_as_unstorable(temp_handler):
    # 5,000 levels: json.dumps itself hits Python's recursion limit (a RecursionError,
    # which escaped as a crash); 101: refused before Django's field encodes it again.
    for depth in (5000, 101):
        nested: object = 1
        for _ in range(depth):
            nested = [nested]
        temp_handler("t.deep", lambda ctx, value=nested: value, max_attempts=3, retry_backoff=0)
        outcome, job = run_one("t.deep")
        assert outcome == "failed" and job.error_type == "UnstorableResult"
        assert "nested more than 100 levels deep" in job.error_message


def test_too_deep_counts_containers_not_brackets_in_strings():
    from jobstate.storable import too_deep

    assert not too_deep("[" * 100 + "]" * 100)
    assert too_deep("[" * 101 + "]" * 101)
    assert too_deep('{"a": ' * 101 + "1" + "}" * 101)
    assert not too_deep('["' + "[" * 500 + '", {"k": "\\"}]')  # brackets inside strings
    assert not too_deep("[" + "[], " * 500 + "[]]")  # wide, not deep


def test_a_nul_in_reported_text_is_stored_as_a_replacement_character(temp_handler):
    # PostgreSQL's text columns refuse NUL, and neither database takes a lone
    # surrogate (an undecodable byte in a file name, escaped by os.fsdecode): the
    # error and the progress message are still recorded, as written but for those
    # characters, and the job is retried as for any error.
    def reports_then_fails(ctx):
        ctx.progress(50, "half\x00way", step="st\x00ep")
        raise RuntimeError("bad\x00input in file-\udcff")

    temp_handler("t.nul_text", reports_then_fails, max_attempts=2, retry_backoff=0)
    outcome, job = run_one("t.nul_text")
    assert outcome == "retrying" and job.status == Status.QUEUED
    assert job.error_message == "bad\ufffdinput in file-\ufffd" and job.error_type == "RuntimeError"
    assert job.progress_message == "half\ufffdway" and job.current_step == "st\ufffdep"
    assert "bad\ufffdinput" in job.traceback and "\x00" not in job.traceback


def test_a_partial_whose_message_holds_a_nul_is_stored_with_its_result(temp_handler):
    def half(ctx):
        raise Partial("2 of 3\x00 done", result={"done": 2})

    temp_handler("t.half_nul", half, max_attempts=2)
    outcome, job = run_one("t.half_nul")
    assert outcome == "partial" and job.status == Status.PARTIAL and job.result == {"done": 2}
    assert job.error_message == "2 of 3\ufffd done"
    assert job.events.get(transition="mark_partial").reason == "2 of 3\ufffd done"


class Unreadable(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("the cache behind it is gone")


def _lazy_failure() -> str:
    raise RuntimeError("no translation loaded")


@pytest.mark.parametrize(
    "result",
    [Unreadable(a=1), {"label": lazy(_lazy_failure, str)()}],
    ids=["mapping whose items() raises", "value whose conversion raises"],
)
def test_a_result_whose_encoding_raises_fails_the_job_as_unstorable(temp_handler, result):
    # A RuntimeError from the result's own code was recorded as an outcome-write
    # failure and retried: the handler's side effects ran again, to fail the same way.
    calls: list[int] = []

    def returns_it(ctx):
        calls.append(ctx.attempt)
        return result

    temp_handler("t.unreadable", returns_it, max_attempts=3, retry_backoff=0)
    outcome, job = run_one("t.unreadable")
    assert (outcome, job.status, job.error_type) == ("failed", Status.FAILED, "UnstorableResult")
    assert "Not JSON-serialisable: RuntimeError: " in job.error_message
    assert transitions(job) == ["enqueue", "claim", "fail"] and calls == [1]


def test_a_database_error_while_a_result_is_encoded_is_not_the_results_fault():
    class Queried(dict):  # type: ignore[type-arg]
        def items(self):  # type: ignore[no-untyped-def]
            raise OperationalError("server closed the connection unexpectedly")

    with pytest.raises(OperationalError):
        result_value(Queried(a=1), "result")


def test_a_partial_with_an_unstorable_result_fails_the_job(temp_handler):
    def half(ctx):
        raise Partial("2 of 3", result={"when": {1, 2}})  # a set: not JSON

    temp_handler("t.half_unstorable", half, max_attempts=3)
    outcome, job = run_one("t.half_unstorable")
    assert outcome == "failed" and job.status == Status.FAILED and job.error_type == "UnstorableResult"
    assert transitions(job) == ["enqueue", "claim", "fail"]


def test_an_error_inside_the_outcome_write_is_recorded_with_that_error(temp_handler):
    def refuse_once(change: hooks.Transition) -> None:
        if change.transition == "complete" and not refused:
            refused.append(change.job_id)
            raise RuntimeError("the audit log is full")

    refused: list[object] = []
    temp_handler("t.fine", lambda ctx: {"ok": True}, max_attempts=2, retry_backoff=0)
    hooks.transitioned.register(refuse_once)
    try:
        outcome, job = run_one("t.fine")
        assert outcome == "retrying" and job.status == Status.QUEUED
        assert job.error_type == "RuntimeError" and "the audit log is full" in job.error_message
        assert "could not be stored" in job.error_message and "RuntimeError" in job.traceback
        assert transitions(job) == ["enqueue", "claim", "requeue"]
        assert drain() == 1
    finally:
        hooks.transitioned.unregister(refuse_once)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 2 and job.result == {"ok": True}


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60})
def test_an_outcome_write_that_fails_keeps_the_last_progress_report(temp_handler, monkeypatch):
    # The last report (kept in memory, coalesced) was taken for the completion;
    # that write failed and the failure recorded instead stored no progress: the
    # job went back to the queue showing the first report, "starting".
    def reports(ctx):
        ctx.progress(10, "starting")  # written at once
        ctx.progress(90, "saving the output")  # kept for the outcome
        return {"ok": True}

    def database_down(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    temp_handler("t.saving", reports, max_attempts=2, retry_backoff=0)
    monkeypatch.setattr(services, "complete", database_down)
    outcome, job = run_one("t.saving")
    assert outcome == "retrying" and job.status == Status.QUEUED
    assert job.error_type == "OperationalError" and "could not be stored" in job.error_message
    assert (job.progress, job.progress_message) == (90, "saving the output")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print this one")


class UnprintableForGood(Unprintable, NonRetryable):
    pass


@pytest.mark.parametrize(
    ("raised", "outcome", "status"),
    [(Unprintable, "retrying", Status.QUEUED), (UnprintableForGood, "failed", Status.FAILED)],
)
def test_an_error_whose_str_raises_is_recorded_as_itself(temp_handler, raised, outcome, status):
    """Its ``__str__`` raised as the error was recorded: the attempt was recorded as an
    outcome-write failure (RuntimeError) and retried, even a NonRetryable."""

    def boom(ctx):
        raise raised("the disk is full")

    temp_handler("t.unprintable", boom, max_attempts=3, retry_backoff=0)
    got, job = run_one("t.unprintable")
    assert (got, job.status, job.error_type) == (outcome, status, raised.__name__)
    assert job.error_message == f"{raised.__name__}('the disk is full')"
    assert "could not be stored" not in job.error_message and "RuntimeError" not in job.error_message


def test_an_outcome_write_error_whose_str_raises_is_recorded_as_itself(temp_handler):
    # Printing it in the failure record raised: the job was left to the reaper.
    def refuse(change: hooks.Transition) -> None:
        if change.transition == "complete":
            raise Unprintable("the audit log is full")

    temp_handler("t.refused", lambda ctx: {"ok": True}, max_attempts=2, retry_backoff=0)
    hooks.transitioned.register(refuse)
    try:
        got, job = run_one("t.refused")
    finally:
        hooks.transitioned.unregister(refuse)
    assert (got, job.status, job.error_type) == ("retrying", Status.QUEUED, "Unprintable")
    assert job.error_message == (
        "The outcome (ok) could not be stored: Unprintable: Unprintable('the audit log is full')"
    )


def test_a_partial_whose_str_raises_is_stored_partial(temp_handler):
    class Half(Partial):
        def __str__(self) -> str:
            raise RuntimeError("cannot print this one")

    def half(ctx):
        raise Half("1 of 2", result={"done": 1})

    temp_handler("t.half_unprintable", half, max_attempts=3)
    got, job = run_one("t.half_unprintable")
    assert (got, job.status, job.result) == ("partial", Status.PARTIAL, {"done": 1})
    assert job.error_message.startswith("Half(")


# -- claimed is not running -------------------------------------------------------


def test_a_reserved_job_is_begun_by_the_worker_that_runs_it(temp_handler):
    seen = {}

    def look(ctx):
        row = Job.objects.get(pk=ctx.job.pk)
        seen.update(attempt=ctx.attempt, attempts=row.attempts, started=row.started_at, worker=row.worker_id)
        return None

    temp_handler("t.look", look)
    services.enqueue("t.look", {})
    (claimed,) = services.claim("host:1")
    assert claimed.attempts == 0 and claimed.started_at is None
    assert list(Job.objects.reserved()) == [claimed] and not Job.objects.running().exists()
    assert run_job(claimed, "host:1:2") == "completed"
    assert seen["attempt"] == seen["attempts"] == 1 and seen["started"] is not None
    assert seen["worker"] == "host:1:2"


def test_an_unknown_kind_fails_without_charging_an_attempt():
    job = services.enqueue("test.echo", {})
    Job.objects.filter(pk=job.pk).update(kind="gone.away")
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "UnknownKind" and job.attempts == 0


def test_an_unknown_kind_whose_cancel_was_requested_ends_cancelled():
    job = services.enqueue("test.echo", {})
    (claimed,) = services.claim("w1")
    services.request_cancel(job, "api", "not needed")
    Job.objects.filter(pk=job.pk).update(kind="gone.away")
    claimed.kind = "gone.away"
    assert run_job(claimed, "w1:1") == "cancelled"
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 0
    assert "UnknownKind: No handler registered" in job.events.order_by("id").last().reason


def test_a_cancel_before_the_handler_started_ends_it_cancelled_unrun(temp_handler):
    ran: list[int] = []
    temp_handler("t.never", lambda ctx: ran.append(1))
    job = services.enqueue("t.never", {})
    (claimed,) = services.claim("w1")
    services.request_cancel(job, "api", "not needed")
    assert run_job(claimed, "w1:1") == "cancelled"
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 0 and ran == [] and job.started_at is None


def test_an_error_before_the_handler_starts_charges_no_attempt(monkeypatch):
    # begin() had charged the attempt: a one-attempt job ended failed, never run.
    from jobstate.worker import runner

    job = services.enqueue("test.echo", {}, max_attempts=1)
    (claimed,) = services.claim("w1")

    def no_slot(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(runner, "Slot", no_slot)
    with pytest.raises(RuntimeError):
        run_job(claimed, "w1:1")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.started_at) == (Status.QUEUED, 0, None)
    assert job.error_message == "the handler could not be started: can't start new thread"
    requeue = job.events.get(transition="requeue")
    assert requeue.reason.startswith("not started (no attempt charged)")
    monkeypatch.undo()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())  # past its backoff
    assert drain() == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 1)


def _fails_before_the_handler(monkeypatch, where: str, times: float) -> None:
    """``services.begin`` (where="begin") or the handler call's set-up after it
    ("setup") raises its first ``times`` calls, then works."""
    from jobstate.worker import runner

    real = services.begin if where == "begin" else runner.Slot
    calls = itertools.count(1)

    def flaky(*args: object, **kwargs: object) -> object:
        if next(calls) <= times:
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(
        services if where == "begin" else runner, "begin" if where == "begin" else "Slot", flaky
    )


def _setup_failure_rows(job: Job) -> list[tuple[str, object, bool]]:
    """(transition, setup_failures, refunded) of each history row that ended a claim."""
    rows = (
        job.events.filter(from_status=Status.PROCESSING).order_by("id").values_list("transition", "metadata")
    )
    return [(name, meta.get("setup_failures"), bool(meta.get("unstarted"))) for name, meta in rows]


@pytest.mark.parametrize("where", ["begin", "setup"])
def test_a_failure_before_the_handler_that_recurs_every_time_ends_failed(monkeypatch, temp_handler, where):
    # Refunded every time, the job was requeued for ever: it never reached a final
    # state, and max_attempts never stopped it (a worker kept busy failing it).
    ran: list[int] = []
    temp_handler("t.unstartable", lambda ctx: ran.append(1), max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.unstartable", {})
    _fails_before_the_handler(monkeypatch, where, float("inf"))
    refunded = conf.get("SETUP_FAILURES_REFUNDED")
    runs = 0
    while job.status != Status.FAILED and runs < 20:
        runs += 1
        Job.objects.filter(pk=job.pk).update(run_after=timezone.now())  # past its backoff
        with pytest.raises(OperationalError):
            drain()
        job.refresh_from_db()
    # The first ones refunded (a dropped connection is no fault of the job), then each
    # charged: the retry policy and max_attempts apply.
    assert runs == refunded + 2 and ran == []
    assert (job.status, job.attempts, job.error_type) == (Status.FAILED, 2, "OperationalError")
    why = "the worker could not start the job" if where == "begin" else "the handler could not be started"
    assert job.error_message == f"{why}: server closed the connection unexpectedly"
    rows = _setup_failure_rows(job)
    assert rows == [
        *[("requeue", n, True) for n in range(1, refunded + 1)],
        ("requeue", refunded + 1, False),
        ("fail", refunded + 2, False),
    ]
    charged = job.events.filter(from_status=Status.PROCESSING).order_by("id")
    said = f"not started {refunded + 1} times in a row, so the attempt is charged: {why}: server closed"
    assert charged[refunded].reason.startswith(f"attempt 1 failed: {said}")
    assert charged[refunded + 1].reason.startswith(f"not started {refunded + 2} times in a row")


@override_settings(JOBSTATE={"SETUP_FAILURES_REFUNDED": 0})
def test_with_no_failure_before_the_handler_refunded_the_first_one_is_charged(monkeypatch, temp_handler):
    temp_handler("t.unstartable", max_attempts=1)
    job = services.enqueue("t.unstartable", {})
    _fails_before_the_handler(monkeypatch, "setup", 1)
    with pytest.raises(OperationalError):
        drain()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.FAILED, 1)
    assert _setup_failure_rows(job) == [("fail", 1, False)]


@pytest.mark.parametrize("where", ["begin", "setup"])
def test_failures_before_the_handler_within_the_bound_are_refunded_and_the_handler_runs(
    monkeypatch, temp_handler, where
):
    ran: list[int] = []
    temp_handler("t.flaky", lambda ctx: ran.append(ctx.attempt), max_attempts=1, retry_backoff=0)
    job = services.enqueue("t.flaky", {})
    refunded = conf.get("SETUP_FAILURES_REFUNDED")
    _fails_before_the_handler(monkeypatch, where, refunded)
    for _ in range(refunded):
        Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
        with pytest.raises(OperationalError):
            drain()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain() == 1
    job.refresh_from_db()
    # A one-attempt job: each failure refunded, the handler ran as attempt 1.
    assert (job.status, job.attempts, ran) == (Status.COMPLETED, 1, [1])
    assert _setup_failure_rows(job) == [
        *[("requeue", n, True) for n in range(1, refunded + 1)],
        ("complete", None, False),
    ]


def test_the_count_of_failures_before_the_handler_starts_again_after_a_run(monkeypatch, temp_handler):
    # Only failures in a row count: a run of the handler in between starts the count again.
    def fails_once(ctx):
        if ctx.attempt == 1:
            raise ValueError("first run fails")

    temp_handler("t.between", fails_once, max_attempts=2, retry_backoff=3600)
    job = services.enqueue("t.between", {})
    _fails_before_the_handler(monkeypatch, "setup", 1)
    with pytest.raises(OperationalError):
        drain()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain() == 1  # the handler's first run fails: retried
    monkeypatch.undo()
    _fails_before_the_handler(monkeypatch, "setup", 1)
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    with pytest.raises(OperationalError):
        drain()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert drain() == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 2)
    assert _setup_failure_rows(job) == [
        ("requeue", 1, True),
        ("requeue", None, False),
        ("requeue", 1, True),
        ("complete", None, False),
    ]


def test_a_failure_past_attempt_1024_is_retried_with_the_capped_backoff(temp_handler):
    # 2 ** 1024 as an int overflowed the float product before the cap applied: the
    # outcome could not be stored, and the job waited for the reaper, error lost.
    def boom(ctx: object) -> None:
        raise ValueError("boom")

    temp_handler("t.forever", boom, max_attempts=conf.MAX_ATTEMPTS_LIMIT)
    job = services.enqueue("t.forever", {})
    # Past the limit a handler may set: operator requeues each add the attempt it needs.
    Job.objects.filter(pk=job.pk).update(attempts=1024, max_attempts=100_000)
    (claimed,) = services.claim("w1")
    before = timezone.now()
    assert run_job(claimed, "w1:1") == "retrying"
    job.refresh_from_db()
    assert (job.status, job.error_message, job.attempts) == (Status.QUEUED, "boom", 1025)
    cap = float(conf.get("RETRY_BACKOFF_MAX")) * (1 + float(conf.get("RETRY_JITTER")))
    assert job.run_after <= before + timedelta(seconds=cap + 5)


def test_the_reaper_requeues_a_reserved_job_without_charging_an_attempt():
    job = services.enqueue("test.echo", {}, max_attempts=1)
    services.claim("dead-cluster:1")
    Job.objects.update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    report = services.requeue_expired()
    assert report.requeued == [job.pk] and not report.failed
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.attempts == 0
    requeue = job.events.get(transition="requeue")
    assert requeue.actor_label == "system:reaper" and "reserved by a cluster" in requeue.reason
    # Its only attempt is still there: it runs once.
    assert drain() == 1
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 1


def test_the_reaper_cancels_a_reserved_job_whose_cancel_was_requested():
    job = services.enqueue("test.echo", {})
    services.claim("dead-cluster:1", lease_seconds=1)
    services.request_cancel(job, "api")
    report = services.requeue_expired(timezone.now() + timedelta(seconds=5))
    assert report.cancelled == [job.pk]
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 0


# -- interrupts never corrupt a connection ----------------------------------------


def _slow_query() -> None:
    """A database call that takes seconds."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_sleep(5)")
        else:
            # SQLite runs a Python function inside the query: the interrupt
            # lands there, in the middle of the statement.
            connection.connection.create_function("slow", 0, _sleep_5)
            cursor.execute("SELECT slow()")


def _sleep_5() -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return 1


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_an_interrupt_in_the_middle_of_a_database_call_leaves_the_next_job_a_clean_connection(
    temp_handler,
):
    temp_handler("t.query", lambda ctx: _slow_query(), timeout=0.5, max_attempts=1)
    temp_handler("t.next", lambda ctx: {"jobs": Job.objects.count()}, max_attempts=1)
    started = time.monotonic()
    outcome, slow = run_one("t.query")
    assert time.monotonic() - started < 4  # interrupted, not waited out
    assert outcome == "failed" and slow.status == Status.FAILED and slow.error_type == "Timeout"
    # The next job on this worker (same thread, same connection alias) runs normally.
    outcome, following = run_one("t.next")
    assert outcome == "completed" and following.result == {"jobs": 2}
    assert following.attempts == 1 and transitions(following) == ["enqueue", "claim", "complete"]


# -- the watchdog does not depend on the heartbeat ---------------------------------


def _loop(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1})
def test_a_hanging_heartbeat_does_not_stop_the_timeout(temp_handler, hung_heartbeat):
    temp_handler("t.long", lambda ctx: _loop(20), timeout=1, max_attempts=1)
    started = time.monotonic()
    outcome, job = run_one("t.long")
    assert hung_heartbeat.is_set()  # the heartbeat was stuck meanwhile
    assert time.monotonic() - started < 8
    assert outcome == "failed" and job.error_type == "Timeout"


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1, "CANCEL_GRACE_SECONDS": 0.5})
def test_a_hanging_heartbeat_does_not_stop_the_cancel_grace(temp_handler, hung_heartbeat):
    def deaf(ctx):
        services.request_cancel(ctx.job.pk, "api", "stop")
        assert ctx.cancel_requested  # seen; then ignored
        _loop(20)

    temp_handler("t.deaf_hb", deaf, max_attempts=1)
    started = time.monotonic()
    outcome, job = run_one("t.deaf_hb")
    assert hung_heartbeat.is_set() and time.monotonic() - started < 8
    assert outcome == "cancelled" and job.status == Status.CANCELLED


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1})
def test_a_heartbeat_that_finds_the_lease_lost_says_so_and_the_handler_is_stopped(temp_handler, caplog):
    def taken_away(ctx):  # no progress call: only the heartbeat can notice
        services.requeue(ctx.job.pk, "admin", "operator took it back")
        _loop(20)

    temp_handler("t.taken_hb", taken_away, max_attempts=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        outcome, job = run_one("t.taken_hb")
    assert time.monotonic() - started < 8
    assert outcome == "lost" and job.status == Status.QUEUED
    assert f"Heartbeat of job {job.pk} refused: lease lost" in caplog.text


# -- a lease that runs out while the heartbeat cannot renew it ---------------------

SHORT_LEASE = {"HEARTBEAT_SECONDS": 0.1, "LEASE_SECONDS": 1, "PROGRESS_FLUSH_SECONDS": 0}


def _unreachable(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise OperationalError("server closed the connection unexpectedly")


@override_settings(JOBSTATE=SHORT_LEASE)
def test_a_handler_whose_heartbeats_fail_is_stopped_when_its_lease_runs_out(
    temp_handler, monkeypatch, caplog
):
    # The database is unreachable from the heartbeat: nothing renews the lease, and
    # once it has run out the reaper may give the job to another worker. The
    # watchdog stops this attempt then rather than let both run.
    monkeypatch.setattr(services, "heartbeat", _unreachable)
    temp_handler("t.cut_off", lambda ctx: _loop(20), max_attempts=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        outcome, job = run_one("t.cut_off")
    assert 0.9 < time.monotonic() - started < 5
    assert outcome == "lost" and job.status == Status.PROCESSING  # the reaper's to requeue
    assert f"Job {job.pk}: its lease runs out and the heartbeat could not renew it" in caplog.text


@override_settings(JOBSTATE=SHORT_LEASE)
def test_a_handler_that_renews_its_lease_itself_runs_on_while_the_heartbeat_fails(temp_handler, monkeypatch):
    def reporting(ctx):  # each progress write renews the lease too
        for percent in range(0, 100, 10):
            ctx.progress(percent)
            _loop(0.2)
        return {"done": True}

    monkeypatch.setattr(services, "heartbeat", _unreachable)
    temp_handler("t.reporting", reporting, max_attempts=1)
    outcome, job = run_one("t.reporting")
    assert outcome == "completed" and job.result == {"done": True}


@override_settings(JOBSTATE=SHORT_LEASE)
def test_a_heartbeat_waiting_on_the_handlers_own_transaction_does_not_stop_it(temp_handler):
    # The handler's transaction holds its job's row (PostgreSQL) or the database's
    # write lock (SQLite) for longer than the lease: the heartbeat waits on it, and
    # so would the reaper. Nobody else can take the job meanwhile: it runs on.
    def holding(ctx):
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=ctx.job.pk).values_list("pk"))
            Group.objects.create(name=f"held-{ctx.job.pk}")
            _loop(2)
        return {"held": True}

    temp_handler("t.holding", holding, max_attempts=1)
    outcome, job = run_one("t.holding")
    assert outcome == "completed" and job.result == {"held": True}


@override_settings(JOBSTATE=SHORT_LEASE)
def test_a_heartbeat_that_hangs_past_the_lease_stops_the_handler_on_postgresql_only(
    temp_handler, hung_heartbeat
):
    # PostgreSQL: the heartbeat's lock waits end after half of HEARTBEAT_SECONDS, so a call
    # that hangs for longer is a connection that no longer answers. SQLite: every
    # wait is a lock wait on the file the reaper shares, and the handler runs on.
    temp_handler("t.hung", lambda ctx: (_loop(2), {"ran": True})[1], max_attempts=1)
    outcome, job = run_one("t.hung")
    assert hung_heartbeat.is_set()
    if connection.vendor == "postgresql":
        assert outcome == "lost" and job.status == Status.PROCESSING
    else:
        assert outcome == "completed" and job.result == {"ran": True}


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite: the reaper waits for the write lock, then races the heartbeat (docs: attempts.md)",
)
@override_settings(JOBSTATE=SHORT_LEASE)
def test_a_handler_held_up_by_the_reaper_waiting_on_its_row_is_not_run_twice(temp_handler):
    # The reaper finds the expired lease while the handler's transaction holds the
    # row: it leaves the job for its next sweep. The heartbeat keeps waiting in the
    # row's queue meanwhile, so a sweep right after the transaction ends finds the
    # lease renewed (or the row still held by the heartbeat) and takes nothing.
    reports: list[services.ReapReport] = []

    def sweep() -> None:
        reaper = threading.Thread(
            target=lambda: (reports.append(services.requeue_expired()), connection.close())
        )
        reaper.start()
        reaper.join(10)

    def holding(ctx):
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=ctx.job.pk).values_list("pk"))
            Group.objects.create(name=f"held-{ctx.job.pk}")
            _loop(1.5)  # the lease (1 s) runs out in the database meanwhile
            sweep()
        sweep()
        _loop(0.3)
        return {"held": True}

    temp_handler("t.held_past_lease", holding, max_attempts=2)
    outcome, job = run_one("t.held_past_lease")
    assert outcome == "completed" and job.attempts == 1
    during, after = reports
    assert during.skipped == [job.pk] and during.total == 0
    assert after.total == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="lock_timeout is PostgreSQL's")
@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.4, "LEASE_SECONDS": 60})
def test_a_heartbeat_that_waited_on_a_lock_queues_again_at_once(temp_handler, monkeypatch):
    # Not at its next beat: it would leave the row's queue for half a beat, and a
    # reaper that came then would take the job the moment the handler's transaction
    # ended (the previous test's second sweep).
    calls: list[tuple[float, float, bool]] = []  # start, end, ended by a lock wait
    real = services.heartbeat

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            beat = real(*args, **kwargs)
        except OperationalError:
            calls.append((started, time.monotonic(), True))
            raise
        calls.append((started, time.monotonic(), False))
        return beat

    def holding(ctx):
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=ctx.job.pk).values_list("pk"))
            _loop(2.5)

    monkeypatch.setattr(services, "heartbeat", timed)
    temp_handler("t.queued_again", holding, max_attempts=1)
    outcome, _job = run_one("t.queued_again")
    assert outcome == "completed"
    gaps = sorted(after[0] - before[1] for before, after in itertools.pairwise(calls) if before[2])
    assert len(gaps) >= 3
    assert gaps[len(gaps) // 2] < 0.1  # a beat is 0.4 s: the next try did not wait for it


def test_reported_text_may_be_a_lazy_translation():
    from django.utils.functional import lazy

    from jobstate.storable import text

    assert text(lazy(lambda: "Échec\x00", str)()) == "Échec\ufffd"


@pytest.mark.parametrize(
    ("error", "lock_wait"),
    [
        ("lock_timeout", True),
        ("statement_timeout", True),
        ("deadlock", True),
        ("psycopg2 lock_timeout", True),
        ("sqlite busy", True),
        ("connection closed", False),
        ("sqlite disk", False),
        ("too many connections", False),
    ],
)
def test_the_heartbeat_tells_a_lock_wait_from_a_failure(error, lock_wait):
    import sqlite3

    import psycopg
    from django.db import utils

    from jobstate.exceptions import waited_on_a_lock

    class Psycopg2Error(Exception):  # psycopg2's errors carry ``pgcode``
        pgcode = "55P03"

    causes = {
        "lock_timeout": psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        "statement_timeout": psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        "deadlock": psycopg.errors.DeadlockDetected("deadlock detected"),
        "psycopg2 lock_timeout": Psycopg2Error("canceling statement due to lock timeout"),
        "sqlite busy": sqlite3.OperationalError("database is locked"),
        "connection closed": psycopg.OperationalError("server closed the connection unexpectedly"),
        "sqlite disk": sqlite3.OperationalError("disk I/O error"),
        "too many connections": psycopg.errors.TooManyConnections("sorry, too many clients already"),
    }
    cause = causes[error]
    try:  # as Django raises it: its own class, the driver's error as the cause
        raise utils.OperationalError(*cause.args) from cause
    except utils.OperationalError as wrapped:
        assert waited_on_a_lock(wrapped) is lock_wait


@pytest.mark.skipif(connection.vendor != "postgresql", reason="lock_timeout is PostgreSQL's")
@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_the_heartbeats_lock_timeout_stays_in_its_own_transaction():
    from jobstate.worker.supervisor import supervisor

    def lock_timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return cursor.fetchone()[0]

    with supervisor()._bounded_waits():
        assert lock_timeout() == "100ms"
    assert lock_timeout() == "0"  # never left on the connection (nor on a pooled one)


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10})
def test_a_progress_report_the_heartbeat_could_not_write_is_kept_for_the_next_try(temp_handler, monkeypatch):
    from jobstate import registry
    from jobstate.worker.context import JobContext

    temp_handler("t.kept", lambda ctx: None)
    services.enqueue("t.kept", {})
    (job,) = services.claim("w1")
    ctx = JobContext(job, registry.get_handler("t.kept"), "w1:1")
    ctx.progress(10, "first")  # written at once
    ctx.progress(20, "second")  # due in 10 s: pending
    real = services.report_progress
    monkeypatch.setattr(services, "report_progress", _unreachable)
    with pytest.raises(OperationalError):
        ctx.flush_progress()
    ctx.progress(30)  # a newer percent; the message of the unwritten report stays
    monkeypatch.setattr(services, "report_progress", real)
    ctx.flush_progress()
    job.refresh_from_db()
    assert (job.progress, job.progress_message) == (30, "second")


def _refuse_first_progress_write(monkeypatch):  # type: ignore[no-untyped-def]
    real = services.report_progress
    calls: list[int] = []

    def refused_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "report_progress", refused_once)


@pytest.mark.parametrize("flush", [0, 0.25])
def test_a_progress_write_the_database_refuses_does_not_fail_the_attempt(temp_handler, monkeypatch, flush):
    """The handler's own write is kept for the heartbeat, as the heartbeat keeps
    its own; the report is stored in the end."""
    _refuse_first_progress_write(monkeypatch)

    def handler(ctx):  # type: ignore[no-untyped-def]
        ctx.progress(10, "starting")
        return {"ok": True}

    temp_handler("t.refused_progress", handler, max_attempts=1)
    with override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": flush}):
        outcome, job = run_one("t.refused_progress")
    assert (outcome, job.status, job.result) == ("completed", Status.COMPLETED, {"ok": True})
    assert job.progress_message == "starting"


@pytest.mark.parametrize("flush", [0, 0.25])
def test_a_kept_progress_report_never_lands_over_a_newer_one(temp_handler, monkeypatch, flush):
    """A refused report is kept; the next report, written, carries it (latest
    values win), so neither the heartbeat nor the outcome writes the older one later."""
    _refuse_first_progress_write(monkeypatch)
    seen = []

    def handler(ctx):  # type: ignore[no-untyped-def]
        ctx.progress(10, "first", step="a")  # refused: kept
        time.sleep(flush)
        ctx.progress(50, "second")  # written, with the kept step
        time.sleep(1.6)  # past the kept report's retry (1 s)
        seen.append(
            Job.objects.values_list("progress", "progress_message", "current_step").get(pk=ctx.job.pk)
        )
        raise ValueError("boom")

    temp_handler("t.stale_progress", handler, max_attempts=1)
    with override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": flush}):
        _outcome, job = run_one("t.stale_progress")
    assert seen == [(50, "second", "a")]
    assert job.status == Status.FAILED and (job.progress, job.progress_message) == (50, "second")


def test_a_progress_write_refused_inside_the_handlers_transaction_is_the_handlers_error(
    temp_handler, monkeypatch
):
    monkeypatch.setattr(services, "report_progress", _unreachable)

    def handler(ctx):  # type: ignore[no-untyped-def]
        with transaction.atomic():
            ctx.progress(10, "starting")

    temp_handler("t.refused_in_atomic", handler, max_attempts=1)
    with override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 0}):
        _outcome, job = run_one("t.refused_in_atomic")
    assert job.status == Status.FAILED and job.error_type == "OperationalError"


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="only PostgreSQL bounds the heartbeat's lock waits"
)
@override_settings(JOBSTATE={"LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.2, "RETRY_JITTER": 0})
def test_a_heartbeat_stuck_in_a_call_loses_its_job_but_not_the_next(temp_handler, monkeypatch):
    """A heartbeat call that never returns (a connection that no longer answers)
    loses the job it renews, by design; the process's next job gets a heartbeat
    that works instead of being lost the same way."""
    from jobstate.worker import heartbeat as heartbeat_module

    real = services.heartbeat
    release = threading.Event()
    calls: list[int] = []

    def hangs_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(heartbeat_module.services, "heartbeat", hangs_once)
    temp_handler("t.hung_beat", lambda ctx: time.sleep(2.0), max_attempts=3)  # twice the lease
    outcomes = []
    try:
        for _ in range(2):
            outcomes.append(run_one("t.hung_beat")[0])
    finally:
        release.set()
    assert outcomes == ["lost", "completed"]
    assert len(calls) > 2  # the new heartbeat renewed the second job's lease


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 0.05})
def test_a_write_lock_never_given_back_does_not_stop_the_heartbeat(temp_handler):
    """An interrupt landing in the handler right after ``progress()`` took the
    write lock, before its try block, leaves the lock taken: the heartbeat's flush
    gives up for now (the report stays pending, the outcome stores it) rather
    than wait on it for good."""
    from jobstate import registry
    from jobstate.worker.context import JobContext

    temp_handler("t.leaked", lambda ctx: None)
    services.enqueue("t.leaked", {})
    (job,) = services.claim("w1")
    ctx = JobContext(job, registry.get_handler("t.leaked"), "w1:1")
    ctx.progress(10, "first")
    ctx.progress(20, "second")  # pending
    assert ctx._writing.acquire(blocking=False)  # taken, never given back
    done = threading.Event()

    def flush() -> None:
        ctx.flush_progress()
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    assert done.wait(5), "the heartbeat's flush waits for good"
    assert ctx.progress_due(time.monotonic()) is not None
    assert ctx.take_progress()["progress_message"] == "second"


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10})
def test_the_outcome_waits_for_the_report_the_heartbeat_is_writing(temp_handler, monkeypatch):
    """The heartbeat took the last report and is writing it as the handler
    returns: the outcome waits for that write, so the job ends with that report,
    not an older one (the write, landing after the outcome, would be refused as a
    lost lease and the report lost)."""
    from jobstate import registry
    from jobstate.worker.context import JobContext
    from jobstate.worker.endings import finish

    temp_handler("t.racing", lambda ctx: None)
    services.enqueue("t.racing", {})
    (job,) = services.claim("w1")
    ctx = JobContext(job, registry.get_handler("t.racing"), "w1:1")
    ctx.progress(10, "first")  # written at once
    ctx.progress(90, "last")  # due in 10 s: pending
    real = services.report_progress
    writing = threading.Event()

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        writing.set()
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "report_progress", slow)
    flushed: list[str] = []

    def heartbeat() -> None:
        try:
            ctx.flush_progress()
            flushed.append("written")
        except LeaseLost:
            flushed.append("lost")
        finally:
            connection.close()

    beat = threading.Thread(target=heartbeat)
    beat.start()
    assert writing.wait(5)
    assert finish(ctx, "ok", {"ok": True}) == "completed"
    beat.join(5)
    job.refresh_from_db()
    assert flushed == ["written"]
    assert (job.status, job.progress, job.progress_message) == (Status.COMPLETED, 100, "last")


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 0.25})
def test_the_report_the_heartbeat_is_writing_is_stored_with_an_outcome_that_waited_no_longer(
    temp_handler, monkeypatch
):
    """The heartbeat's write waits on the database longer than the outcome waits
    for it (SQLite's busy timeout, under load): the report is still pending, and
    the outcome stores it."""
    from jobstate import registry
    from jobstate.worker.context import JobContext
    from jobstate.worker.endings import finish

    temp_handler("t.slow_beat", lambda ctx: None)
    services.enqueue("t.slow_beat", {})
    (job,) = services.claim("w1")
    ctx = JobContext(job, registry.get_handler("t.slow_beat"), "w1:1")
    ctx.progress(10, "first")  # written at once
    ctx.progress(90, "last")  # pending
    real = services.report_progress
    writing = threading.Event()

    def slower_than_the_outcome_waits(*args, **kwargs):  # type: ignore[no-untyped-def]
        writing.set()
        time.sleep(1.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "report_progress", slower_than_the_outcome_waits)

    def heartbeat() -> None:
        try:
            ctx.flush_progress()
        except LeaseLost:
            pass
        finally:
            connection.close()

    beat = threading.Thread(target=heartbeat)
    beat.start()
    assert writing.wait(5)
    assert finish(ctx, "ok", {"ok": True}) == "completed"
    beat.join(5)
    job.refresh_from_db()
    assert (job.status, job.progress_message) == (Status.COMPLETED, "last")


def test_one_heartbeat_and_one_watchdog_per_process(temp_handler):
    temp_handler("t.quick", lambda ctx: None)
    for _ in range(3):
        services.enqueue("t.quick", {})
    assert drain() == 3
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("jobstate-"))
    assert names == ["jobstate-heartbeat", "jobstate-watchdog"]


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.1})
def test_the_process_heartbeat_records_the_worker_busy_and_idle(temp_handler):
    busy: list[object] = []

    def watch(ctx):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not busy:
            row = WorkerProcess.objects.filter(name="host:1:2").values_list("job_id", flat=True).first()
            if row is not None and str(row) == str(ctx.job.pk):
                busy.append(row)
            time.sleep(0.05)

    temp_handler("t.watch", watch)
    from jobstate.worker.supervisor import supervisor

    sup = supervisor()
    sup.serve_as("host:1:2", "host:1")
    try:

        def idle_row() -> WorkerProcess | None:
            return WorkerProcess.objects.filter(name="host:1:2", job_id__isnull=True).first()

        _wait(idle_row)
        row = idle_row()
        assert row is not None and row.role == "worker" and row.cluster == "host:1"
        outcome, _job = run_one("t.watch")
        assert outcome == "completed" and busy
        done = WorkerProcess.objects.filter(name="host:1:2", job_id__isnull=True, jobs_done=1)
        _wait(done.exists)
    finally:
        sup.identity = None
        time.sleep(0.3)  # a beat under way ends before the tables are flushed


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.05})
def test_a_worker_process_that_ends_cleanly_removes_its_row_and_beats_no_more():
    """``retire`` runs as a django-q2 worker process returns from its loop (the
    cluster's graceful stop): its row goes, and the heartbeat does not write it again."""
    from jobstate.worker.supervisor import supervisor

    sup = supervisor()
    sup.serve_as("host:1:3", "host:1")
    try:
        _wait(WorkerProcess.objects.filter(name="host:1:3").exists)
        sup.retire()
        assert sup.identity is None
        time.sleep(0.3)  # several heartbeat intervals
        assert not WorkerProcess.objects.filter(name="host:1:3").exists()
    finally:
        sup.identity = None
        time.sleep(0.2)  # a beat under way ends before the tables are flushed


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_a_clean_exit_waits_for_a_database_that_does_not_answer_a_heartbeat_at_most(monkeypatch, caplog):
    """A graceful stop's row removals (a worker process's ``retire``, the pusher's)
    on a database that no longer answers (packets dropped) waited for the TCP
    timeout, minutes; the process, and the cluster's stop, with them."""
    from jobstate.services import workers
    from jobstate.worker import leases
    from jobstate.worker.supervisor import supervisor

    answered = threading.Event()

    def hangs(name: str) -> None:
        answered.wait(5)

    sup = supervisor()
    sup.serve_as("host:1:5", "host:1")
    try:
        _wait(WorkerProcess.objects.filter(name="host:1:5").exists)
        monkeypatch.setattr(workers, "gone", hangs)
        for exit_hook in (sup.retire, lambda: leases._pusher_gone("host:1:pusher")):
            started = time.monotonic()
            exit_hook()
            assert time.monotonic() - started < 2
        assert sup.identity is None
        assert caplog.text.count("the database did not answer in time") == 2
    finally:
        answered.set()
        sup.identity = None
        time.sleep(0.3)  # a beat under way ends before the tables are flushed


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.05})
def test_a_process_beat_stuck_in_its_call_does_not_stop_the_job_heartbeats(temp_handler):
    """A heartbeat stuck in its process beat's call (a connection that no longer
    answers) holds the beat lock; the heartbeat that replaces it must still renew
    the job's lease, not wait behind that lock."""
    from jobstate.worker.supervisor import supervisor

    renewals: list[float] = []

    def watch(ctx):
        start, deadline = ctx.lease_until, time.monotonic() + 3
        while time.monotonic() < deadline and ctx.lease_until <= start:
            time.sleep(0.02)
        renewals.append(ctx.lease_until - start)

    temp_handler("t.renewed", watch)
    sup = supervisor()
    sup.serve_as("host:1:4", "host:1")
    _wait(WorkerProcess.objects.filter(name="host:1:4").exists)
    sup._beat_lock.acquire()  # the stuck beat
    try:
        outcome, _job = run_one("t.renewed")
        assert outcome == "completed" and renewals[0] > 0, renewals
    finally:
        sup._beat_lock.release()
        sup.identity = None
        time.sleep(0.2)  # a beat under way ends before the tables are flushed


def _wait(predicate, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


# -- progress coalescing ---------------------------------------------------------------


@pytest.fixture
def progress_writes(monkeypatch):  # type: ignore[no-untyped-def]
    writes: list[tuple[object, ...]] = []
    real = services.report_progress

    def counted(job, token, percent, message=None, **kwargs):  # type: ignore[no-untyped-def]
        writes.append((percent, message))
        return real(job, token, percent, message, **kwargs)

    monkeypatch.setattr(services, "report_progress", counted)
    return writes


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10})
def test_progress_is_coalesced_and_the_last_value_is_stored_with_the_outcome(temp_handler, progress_writes):
    def chatty(ctx):
        for i in range(1, 101):
            ctx.progress(i * 0.9, f"item {i}", step="items")
        return {"items": 100}

    temp_handler("t.chatty", chatty)
    outcome, job = run_one("t.chatty")
    assert outcome == "completed" and progress_writes == [(0.9, "item 1")]  # the first call only
    assert job.progress == 100 and job.progress_message == "item 100" and job.current_step == "items"


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10})
def test_the_last_progress_is_stored_with_a_failure_too(temp_handler, progress_writes):
    def fails(ctx):
        ctx.progress(10, "starting")
        ctx.progress(60, "loading rows")
        raise ValueError("bad row")

    temp_handler("t.fails_late", fails, max_attempts=1)
    outcome, job = run_one("t.fails_late")
    assert outcome == "failed" and len(progress_writes) == 1
    assert (job.progress, job.progress_message) == (60, "loading rows")


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 0.2, "HEARTBEAT_SECONDS": 10})
def test_pending_progress_is_written_by_the_heartbeat_when_due(temp_handler, progress_writes):
    seen: list[int] = []

    def quiet_after(ctx):
        ctx.progress(10, "a")
        ctx.progress(20, "b")  # too soon: kept for later
        seen.append(Job.objects.get(pk=ctx.job.pk).progress)
        _wait(lambda: Job.objects.filter(pk=ctx.job.pk, progress=20).exists(), 3)
        seen.append(20)

    temp_handler("t.quiet", quiet_after)
    outcome, _job = run_one("t.quiet")
    assert outcome == "completed" and seen == [10, 20]
    assert progress_writes == [(10, "a"), (20, "b")]


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 0})
def test_a_zero_flush_interval_writes_every_call(temp_handler, progress_writes):
    def five(ctx):
        for i in range(5):
            ctx.progress(i * 10)

    temp_handler("t.five", five)
    assert run_one("t.five")[0] == "completed" and len(progress_writes) == 5


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10, "HEARTBEAT_SECONDS": 0.1})
def test_coalesced_progress_still_notices_a_cancel_and_refuses_a_lost_lease(temp_handler, progress_writes):
    raised: list[str] = []

    def until_refused(ctx):
        ctx.progress(1)
        if ctx.parameters["then"] == "cancel":
            services.request_cancel(ctx.job.pk, "api", "stop")
        else:
            services.requeue(ctx.job.pk, "admin", "taken back")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                ctx.progress(2)
            except (CancelRequested, LeaseLost) as exc:
                raised.append(type(exc).__name__)
                raise
            time.sleep(0.01)

    temp_handler("t.refused", until_refused, max_attempts=1)
    outcome, job = run_one("t.refused", {"then": "cancel"})
    assert outcome == "cancelled" and job.status == Status.CANCELLED
    outcome, job = run_one("t.refused", {"then": "requeue"})
    # Refused by progress() or interrupted by the watchdog, whichever comes first:
    # either way nothing more is written with the lost lease.
    assert outcome == "lost" and job.status == Status.QUEUED and job.progress == 1
    assert raised[0] == "CancelRequested" and raised[1:] in ([], ["LeaseLost"])
    assert len(progress_writes) == 2


@override_settings(
    JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60, "HEARTBEAT_SECONDS": 0.1, "CANCEL_GRACE_SECONDS": 0.3}
)
@pytest.mark.parametrize("ends", ["cancel_requested", "error", "suspend", "grace_over"])
def test_the_last_progress_is_stored_with_a_cancel_too(temp_handler, progress_writes, ends):
    # Completion and failure stored the pending report; every way to end
    # cancelled dropped it, and the cancelled job showed "starting".
    def cancelled_while_reading(ctx):
        ctx.progress(10, "starting")  # written at once
        ctx.progress(40, "reading")  # kept for the outcome
        services.request_cancel(ctx.job.pk, "api", "stop")
        assert ctx.cancel_requested
        if ends == "cancel_requested":
            ctx.check_cancelled()
        if ends == "error":
            raise ValueError("bad row")
        if ends == "suspend":
            raise Suspend()
        _loop(20)  # deaf to the cancel: stopped once the grace period is over

    temp_handler("t.cancelled_reading", cancelled_while_reading, max_attempts=2)
    outcome, job = run_one("t.cancelled_reading")
    assert outcome == "cancelled" and job.status == Status.CANCELLED
    assert (job.progress, job.progress_message) == (40, "reading") and len(progress_writes) == 1


def test_the_admin_counts_only_begun_jobs_as_running():
    from jobstate.admin import job_columns

    for _ in range(3):
        services.enqueue("test.echo", {})
    reserved, begun, _also_reserved = services.claim("host:1", limit=3)
    services.begin(begun, begun.lease_token, "host:1:2")
    now = timezone.now()
    assert list(Job.objects.running().values_list("pk", flat=True)) == [begun.pk]  # not 3 "running"
    assert Job.objects.reserved().count() == 2
    reserved.refresh_from_db()
    begun.refresh_from_db()
    assert "reserved" in job_columns.age_or_duration(reserved, now)
    assert "running" in job_columns.age_or_duration(begun, now)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="idle_in_transaction_session_timeout")
@pytest.mark.django_db(transaction=True)
@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2, "LEASE_SECONDS": 1})
def test_a_process_frozen_inside_the_heartbeats_transaction_does_not_hold_the_job(temp_handler):
    # Frozen (SIGSTOP, a paused machine) between the beat's UPDATE and its COMMIT, it
    # held the row lock for as long as it stayed frozen, and the reaper, which leaves
    # held rows for its next sweep, never took the job back (an end-to-end test that
    # froze a worker caught it): the server now ends that transaction after half a lease.
    from jobstate.worker.supervisor import supervisor

    services.enqueue("test.echo", {})
    (held,) = services.claim("w1")
    frozen, errors = threading.Event(), []

    def beat_then_freeze() -> None:
        try:
            with supervisor()._bounded_waits():  # the process's own: it starts no thread
                services.heartbeat(held, held.lease_token)
                frozen.set()
                time.sleep(2.5)  # the process stops here
        except BaseException as exc:  # the server closed the session
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=beat_then_freeze)
    thread.start()
    assert frozen.wait(5)
    time.sleep(1.2)  # past half a lease
    with transaction.atomic():
        free = Job.objects.select_for_update(nowait=True).filter(pk=held.pk).values_list("pk", flat=True)
        assert list(free) == [held.pk]  # not locked any more
    thread.join(10)
    assert errors, "the frozen transaction should have been ended by the server"
    report = services.requeue_expired(now=timezone.now() + timedelta(seconds=5))
    assert report.requeued == [held.pk] and not report.skipped


def test_a_result_over_max_result_bytes_fails_the_job_and_is_never_rerun(temp_handler, settings):
    # A result the database refuses for its size (jsonb stops near 256 MB) was a database
    # error at the outcome, retried as a crash: the handler ran again on every attempt.
    settings.JOBSTATE = {"MAX_RESULT_BYTES": 100}
    calls: list[int] = []

    def returns(ctx, size=200):
        calls.append(ctx.attempt)
        return "x" * size

    temp_handler("t.big_result", returns, max_attempts=3, retry_backoff=0)
    outcome, job = run_one("t.big_result")
    assert outcome == "failed" and calls == [1] and job.error_type == "UnstorableResult"
    assert "202 bytes of JSON, over MAX_RESULT_BYTES (100)" in job.error_message
    assert job.result is None and drain() == 0 and calls == [1]
    temp_handler("t.small_result", lambda ctx: "x" * 98, max_attempts=3)
    outcome, job = run_one("t.small_result")
    assert outcome == "completed" and job.result == "x" * 98  # 100 bytes with its quotes


def test_an_unstorable_result_keeps_the_last_progress_report(temp_handler, settings):
    # The outcome takes the pending report to store it with the result; an unstorable
    # result dropped it, and the failed job showed an older message.
    settings.JOBSTATE = {"PROGRESS_FLUSH_SECONDS": 3600}  # coalesced: the report waits for the outcome

    def reports_then_returns(ctx):
        ctx.progress(10, "first")
        ctx.progress(90, "almost there")
        return {"handle": object()}

    temp_handler("t.unstorable_progress", reports_then_returns, max_attempts=3)
    outcome, job = run_one("t.unstorable_progress")
    assert outcome == "failed" and job.error_type == "UnstorableResult"
    assert (job.progress, job.progress_message) == (90, "almost there")
