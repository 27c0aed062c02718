"""The worker's log line for an attempt that did not succeed (``jobstate.worker``):
nothing was logged when a handler raised; only the job row held the error."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from django.db import OperationalError
from django.test import override_settings
from django_q.exceptions import TimeoutException

from jobstate import NonRetryable, Partial, services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import endings, outcome_log, runner, tasks
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db(transaction=True)


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "jobstate.worker"]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    names = ("job_id", "kind", "attempt", "max_attempts", "outcome", "error_type", "retry_at")
    return {name: getattr(record, name) for name in names}


@pytest.fixture
def drained(temp_handler, caplog):  # type: ignore[no-untyped-def]
    """``drained(kind, func, level=..., **options)``: register ``func`` for ``kind``,
    enqueue one job and drain it, ``jobstate`` logged from ``level``; the job as it ended."""

    def run(kind: str, func: Callable[[Any], Any], *, level: int = logging.DEBUG, **options: Any) -> Job:
        temp_handler(kind, func, **options)
        job = services.enqueue(kind, {})
        caplog.set_level(level, logger="jobstate")
        drain()
        job.refresh_from_db()
        return job

    return run


def test_a_retry_is_a_warning_and_the_last_failure_an_error_with_the_handler_s_traceback(drained, caplog):
    def parse_row(ctx):
        raise ValueError(f"bad row {ctx.attempt}")

    job = drained("t.boom", parse_row, max_attempts=2, retry_backoff=0)
    assert job.attempts == 2
    retry, final = records(caplog)

    assert retry.levelno == logging.WARNING and retry.exc_info is None
    retry_at = retry.retry_at  # type: ignore[attr-defined]
    assert datetime.fromisoformat(retry_at) <= job.started_at  # it ran again at or after that time
    at = datetime.fromisoformat(retry_at).isoformat(timespec="seconds")
    assert (
        retry.getMessage()
        == f"Job {job.pk} (t.boom) attempt 1 of 2 failed; runs again at {at}: ValueError: bad row 1"
    )
    assert fields(retry) == {
        "job_id": str(job.pk),
        "kind": "t.boom",
        "attempt": 1,
        "max_attempts": 2,
        "outcome": "retrying",
        "error_type": "ValueError",
        "retry_at": retry_at,
    }

    assert final.levelno == logging.ERROR
    assert final.getMessage() == f"Job {job.pk} (t.boom) failed on attempt 2 of 2: ValueError: bad row 2"
    assert fields(final) == {**fields(retry), "attempt": 2, "outcome": "failed", "retry_at": None}
    assert final.exc_info is not None
    error = final.exc_info[1]
    assert isinstance(error, ValueError) and str(error) == "bad row 2"
    # The handler's traceback, as the job row stores it: its innermost frame is the handler.
    assert traceback.extract_tb(final.exc_info[2])[-1].name == "parse_row"
    assert "".join(traceback.format_exception(error)) == job.traceback
    assert caplog.text.count("Traceback (most recent call last)") == 1


def test_a_handler_that_succeeds_logs_nothing(drained, caplog):
    assert drained("t.ok", lambda ctx: {"rows": 1}).status == Status.COMPLETED
    assert records(caplog) == []


def test_a_non_retryable_error_fails_for_good_on_its_first_attempt(drained, caplog):
    def nope(ctx):
        raise NonRetryable("no point\nsecond line of the message")

    job = drained("t.nope", nope, level=logging.INFO, max_attempts=5)
    (final,) = records(caplog)
    assert final.levelno == logging.ERROR and final.exc_info is not None
    # One line: the message's line breaks are not the log line's.
    assert final.getMessage() == (
        f"Job {job.pk} (t.nope) failed on attempt 1 of 5: NonRetryable: no point second line of the message"
    )


def test_a_cancelled_attempt_is_info(drained, caplog):
    def slow(ctx):
        services.request_cancel(ctx.job.pk, "api", "changed my mind")
        ctx.progress(10)

    job = drained("t.slow", slow, level=logging.INFO)
    (cancelled,) = records(caplog)
    assert cancelled.levelno == logging.INFO and cancelled.exc_info is None
    assert cancelled.getMessage().startswith(
        f"Job {job.pk} (t.slow) cancelled on attempt 1 of 3: CancelRequested"
    )
    assert cancelled.outcome == "cancelled"  # type: ignore[attr-defined]


def test_an_error_after_a_cancel_request_is_one_info_line(drained, caplog):
    # The attempt ends cancelled (services.fail's cancel instead): the service layer
    # logged it too, so the attempt gave two INFO lines.
    def late(ctx):
        services.request_cancel(ctx.job.pk, "api", "changed my mind")
        raise ValueError("bad row")

    job = drained("t.late", late, level=logging.INFO)
    assert job.status == Status.CANCELLED
    (cancelled,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert cancelled.name == "jobstate.worker" and cancelled.levelno == logging.INFO
    assert cancelled.getMessage() == f"Job {job.pk} (t.late) cancelled on attempt 1 of 3: ValueError: bad row"


@pytest.mark.parametrize("max_attempts", [2, 1])
def test_an_outcome_write_that_fails_is_logged_as_the_outcome_stored_instead(
    drained, caplog, monkeypatch, max_attempts
):
    # The attempt was recorded failed with the write's error: the jobstate logger's
    # "its outcome (ok) could not be stored" was its only line, no outcome line.
    def database_down(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "complete", database_down)
    job = drained("t.saving", lambda ctx: {"ok": True}, level=logging.INFO, max_attempts=max_attempts)
    assert job.error_message == (
        "The outcome (ok) could not be stored: OperationalError: server closed the connection unexpectedly"
    )
    (line,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert line.name == "jobstate.worker" and line.error_type == "OperationalError"  # type: ignore[attr-defined]
    if max_attempts == 2:
        assert line.levelno == logging.WARNING and line.outcome == "retrying"  # type: ignore[attr-defined]
        at = job.run_after.isoformat(timespec="seconds")
        assert line.getMessage() == (
            f"Job {job.pk} (t.saving) attempt 1 of 2 failed; runs again at {at}: "
            f"OperationalError: {job.error_message}"
        )
    else:
        assert line.levelno == logging.ERROR and line.exc_info is not None
        assert isinstance(line.exc_info[1], OperationalError)  # the write's error, not the logger's frames
        assert line.getMessage() == (
            f"Job {job.pk} (t.saving) failed on attempt 1 of 1: OperationalError: {job.error_message}"
        )


def test_a_cancel_recorded_after_a_failed_outcome_write_is_one_info_line(drained, caplog, monkeypatch):
    # The write of the handler's error raised, then the failure recorded instead ended
    # the job cancelled: no cancel line, only the write's error.
    real = services.fail_held
    calls: list[int] = []

    def first_write_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a hook raised inside the outcome's transaction")
        return real(*args, **kwargs)

    def late(ctx):
        services.request_cancel(ctx.job.pk, "api", "changed my mind")
        raise ValueError("bad row")

    monkeypatch.setattr(services, "fail_held", first_write_fails)
    job = drained("t.late2", late, level=logging.INFO)
    assert job.status == Status.CANCELLED
    (cancelled,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert cancelled.name == "jobstate.worker" and cancelled.levelno == logging.INFO
    assert cancelled.getMessage() == (
        f"Job {job.pk} (t.late2) cancelled on attempt 1 of 3: RuntimeError: The outcome (error) could not "
        "be stored: RuntimeError: a hook raised inside the outcome's transaction"
    )


@pytest.mark.parametrize("how", ["returned", "partial", "cancelled"])
def test_a_result_that_cannot_be_stored_is_one_line_of_the_outcome_stored(drained, caplog, how):
    # The jobstate logger's "the handler's result cannot be stored" was logged first,
    # whatever was stored: no cancel line, and a Partial's failure logged a second
    # line with the Partial's text.
    def unstorable(ctx):
        if how == "cancelled":
            services.request_cancel(ctx.job.pk, "api", "changed my mind")
        if how == "partial":
            raise Partial("2 of 3", result={"when": {1, 2}})  # a set: not JSON
        return {"when": {1, 2}}

    job = drained("t.unstorable", unstorable, level=logging.INFO)
    assert job.status == (Status.CANCELLED if how == "cancelled" else Status.FAILED)
    (line,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert line.name == "jobstate.worker" and line.error_type == "UnstorableResult"  # type: ignore[attr-defined]
    ended = "cancelled" if how == "cancelled" else "failed"
    assert line.levelno == (logging.INFO if how == "cancelled" else logging.ERROR)
    assert line.getMessage().startswith(
        f"Job {job.pk} (t.unstorable) {ended} on attempt 1 of 3: UnstorableResult: "
        "The handler's result could not be stored: "
    )


def test_a_kind_without_a_handler_is_an_error_with_the_stored_error(caplog):
    # Failed (no attempt charged) before any handler was looked for: nothing was logged.
    job = services.enqueue("test.echo", {})
    Job.objects.filter(pk=job.pk).update(kind="gone.away")
    caplog.set_level(logging.INFO, logger="jobstate")
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "UnknownKind"
    (final,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert final.name == "jobstate.worker" and final.levelno == logging.ERROR and final.exc_info is None
    assert final.getMessage() == (
        f"Job {job.pk} (gone.away) failed on attempt 1 of {job.max_attempts}: "
        f"UnknownKind: {job.error_message}"
    )
    assert fields(final) == {
        "job_id": str(job.pk),
        "kind": "gone.away",
        "attempt": 1,
        "max_attempts": job.max_attempts,
        "outcome": "failed",
        "error_type": "UnknownKind",
        "retry_at": None,
    }


def test_a_cancel_requested_before_the_handler_started_is_info(caplog):
    # Cancelled before it began (no attempt charged, the handler never called): the
    # other cancels log the worker's INFO line; this one logged nothing.
    job = services.enqueue("test.echo", {}, max_attempts=2)
    (claimed,) = services.claim("w1")
    services.request_cancel(job.pk, "api", "changed my mind")
    caplog.set_level(logging.INFO, logger="jobstate")
    assert runner.run_job(claimed, "w1") == "cancelled"
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.CANCELLED, 0)
    (cancelled,) = records(caplog)
    assert cancelled.levelno == logging.INFO and cancelled.exc_info is None
    assert (
        cancelled.getMessage()
        == f"Job {job.pk} (test.echo) cancelled on attempt 1 of 2: cancelled before it started"
    )
    assert fields(cancelled) == {
        "job_id": str(job.pk),
        "kind": "test.echo",
        "attempt": 1,
        "max_attempts": 2,
        "outcome": "cancelled",
        "error_type": "",
        "retry_at": None,
    }


@pytest.mark.parametrize("where", ["begin", "setup"])
def test_an_error_before_the_handler_starts_is_logged_as_the_attempt_s_outcome(monkeypatch, caplog, where):
    # services.begin failed (no attempt charged), or the handler's call could not be set
    # up (begin's attempt refunded): the job is requeued with the error, logged nowhere.
    def broken(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    if where == "begin":
        monkeypatch.setattr(services, "begin", broken)
    else:
        monkeypatch.setattr(runner, "Slot", broken)
    job = services.enqueue("test.echo", {}, max_attempts=2)
    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.raises(OperationalError):
        drain()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error_type) == (Status.QUEUED, 0, "OperationalError")
    (retry,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert retry.name == "jobstate.worker" and retry.levelno == logging.WARNING
    at = job.run_after.isoformat(timespec="seconds")
    assert retry.getMessage() == (
        f"Job {job.pk} (test.echo) could not start attempt 1 of 2 (no attempt charged); runs again at {at}: "
        f"OperationalError: {job.error_message}"
    )
    why = "the worker could not start the job" if where == "begin" else "the handler could not be started"
    assert job.error_message == f"{why}: server closed the connection unexpectedly"
    assert fields(retry) == {
        "job_id": str(job.pk),
        "kind": "test.echo",
        "attempt": 1,
        "max_attempts": 2,
        "outcome": "retrying",
        "error_type": "OperationalError",
        "retry_at": job.run_after.isoformat(),
    }


@pytest.mark.parametrize("where", ["begin", "setup"])
@override_settings(JOBSTATE={"SETUP_FAILURES_REFUNDED": 0})
def test_an_error_before_the_handler_starts_that_charges_the_attempt_is_logged_as_a_failed_attempt(
    monkeypatch, caplog, where
):
    # Past the refunded bound the attempt is charged: the line says it failed.
    def broken(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(
        services if where == "begin" else runner, "begin" if where == "begin" else "Slot", broken
    )
    job = services.enqueue("test.echo", {}, max_attempts=2)
    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.raises(OperationalError):
        drain()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.QUEUED, 1)
    (retry,) = [r for r in caplog.records if r.levelno >= logging.INFO]
    at = job.run_after.isoformat(timespec="seconds")
    assert retry.getMessage() == (
        f"Job {job.pk} (test.echo) attempt 1 of 2 failed; runs again at {at}: OperationalError: "
        f"{job.error_message}"
    )


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_a_timeout_is_a_warning_when_retried_an_error_without_a_traceback_when_final(drained, caplog):
    def forever(ctx):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.05)

    job = drained("t.forever", forever, level=logging.INFO, timeout=0.5, max_attempts=2, retry_backoff=0)
    assert job.status == Status.FAILED
    retry, final = records(caplog)
    assert (retry.levelno, final.levelno) == (logging.WARNING, logging.ERROR)
    assert retry.getMessage().endswith(": Timeout: Timed out after 0.5 s")
    assert (
        final.getMessage()
        == f"Job {job.pk} (t.forever) failed on attempt 2 of 2: Timeout: Timed out after 0.5 s"
    )
    assert final.exc_info is None  # no error of the handler's to show


def test_django_q_s_hard_time_limit_is_logged_as_the_attempt_s_outcome(temp_handler, caplog):
    def stuck(ctx):
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.stuck", stuck, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.stuck", {})
    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.raises(TimeoutException):
        tasks.run_by_id(str(job.pk))
    (retry,) = records(caplog)
    assert retry.levelno == logging.WARNING
    assert retry.getMessage().startswith(f"Job {job.pk} (t.stuck) attempt 1 of 2 failed; runs again at ")
    assert retry.getMessage().endswith(": HardTimeout: Stopped by the worker's hard time limit")


def test_django_q_s_hard_time_limit_outside_the_handler_is_logged_as_the_attempt_s_outcome(
    temp_handler, caplog, monkeypatch
):
    # It fired as the outcome was to be written: tasks recorded HardTimeout, logged nowhere.
    def hard_limit(*args: object, **kwargs: object) -> str:
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.quick", lambda ctx: None, max_attempts=2, retry_backoff=0)
    monkeypatch.setattr(runner, "finish", hard_limit)
    job = services.enqueue("t.quick", {})
    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.raises(TimeoutException):
        tasks.run_by_id(str(job.pk))
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.QUEUED, "HardTimeout")
    (retry,) = records(caplog)
    at = job.run_after.isoformat(timespec="seconds")
    assert retry.levelno == logging.WARNING
    assert retry.getMessage() == (
        f"Job {job.pk} (t.quick) attempt 1 of 2 failed; runs again at {at}: "
        "HardTimeout: Stopped by the worker's hard time limit"
    )


def test_nothing_is_formatted_when_the_level_is_off(drained, caplog, monkeypatch):
    def boom(ctx):
        raise ValueError("bad")

    def no_formatting(text: str) -> str:
        raise AssertionError("formatted for a level that is off")

    monkeypatch.setattr(outcome_log, "_one_line", no_formatting)
    assert drained("t.boom", boom, level=logging.CRITICAL, max_attempts=2, retry_backoff=0).attempts == 2
    assert records(caplog) == []


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_nothing_is_formatted_for_a_timeout_when_the_level_is_off(drained, caplog, monkeypatch):
    # The timeout's text was formatted for the line before the level was checked.
    def forever(ctx):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.05)

    def no_formatting(*args: object) -> tuple[str, str]:
        raise AssertionError("formatted for a level that is off")

    monkeypatch.setattr(endings, "_interrupt_error", no_formatting)
    job = drained("t.forever", forever, level=logging.CRITICAL, timeout=0.5, max_attempts=1)
    assert (job.status, job.error_type) == (Status.FAILED, "Timeout")
    assert records(caplog) == []


def test_a_nul_or_lone_surrogate_in_the_error_is_logged_as_stored(drained, caplog):
    # An undecodable file name (os.fsdecode's lone surrogate) or a NUL in the error: a
    # UTF-8 handler cannot write such a record ("--- Logging error ---"; pytest-xdist
    # failed on it), so the line and the traceback carry U+FFFD, as the job row does.
    def reads(ctx):
        raise ValueError(f"cannot read file-\udcff (attempt {ctx.attempt})\x00")

    job = drained("t.fsname", reads, max_attempts=2, retry_backoff=0)
    assert job.attempts == 2
    retry, final = records(caplog)
    for record in (retry, final):
        formatted = logging.Formatter().format(record)
        formatted.encode("utf-8")  # no lone surrogate left
        assert "\x00" not in formatted and "file-\ufffd" in formatted
    assert final.levelno == logging.ERROR and final.exc_info is None
    assert "Traceback (most recent call last)" in final.getMessage() and "in reads" in final.getMessage()
    assert job.status == Status.FAILED


def test_a_log_filter_that_raises_does_not_undo_the_stored_outcome(drained, caplog):
    # Logging catches what a handler's emit raises, not a logger's filter: the outcome
    # is stored by then, and the attempt still ends (its attempt_ended hook runs).
    def boom(ctx):
        raise ValueError("bad")

    def broken_filter(record: logging.LogRecord) -> bool:
        if getattr(record, "outcome", None):
            raise RuntimeError("the filter is broken")
        return True

    worker_logger = logging.getLogger("jobstate.worker")
    worker_logger.addFilter(broken_filter)
    try:
        job = drained("t.filtered", boom, max_attempts=1)
    finally:
        worker_logger.removeFilter(broken_filter)
    assert job.status == Status.FAILED
    assert any("could not be logged" in r.getMessage() for r in caplog.records)


def test_an_error_whose_text_cannot_be_had_is_logged_by_its_type(drained, caplog):
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def boom(ctx):
        raise Unprintable()

    job = drained("t.unprintable", boom, max_attempts=2, retry_backoff=0)
    assert (job.status, job.attempts) == (Status.FAILED, 2)
    assert [r.levelno for r in records(caplog)] == [logging.WARNING, logging.ERROR]
    assert "Unprintable" in records(caplog)[0].getMessage()
