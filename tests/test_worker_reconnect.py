"""Workers and the pusher when the database goes away: connections killed from
another session (``pg_terminate_backend``, as a server restart or a failover
leaves them), in-process."""

from __future__ import annotations

import copy
import logging
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, close_old_connections, connection
from django.test import override_settings
from django.utils import timezone
from django_q.conf import Conf

from jobstate import hooks, services
from jobstate.exceptions import Partial
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import connections, counters, outage, tasks
from jobstate.worker.runner import run_job
from tests.test_worker_broker import run, unpack

pytestmark = pytest.mark.django_db(transaction=True)


def kill_connection() -> None:
    """End this thread's database session from another one, and wait until it is gone."""
    import psycopg

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 30
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the killed backend did not go away"
            time.sleep(0.01)


def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a server session to kill: PostgreSQL only")


@override_settings(JOBSTATE={"WORKER_CONN_MAX_AGE": 300})
def test_a_worker_whose_connection_was_killed_between_jobs_runs_the_next_job(broker):
    """The connection a worker process keeps between jobs (``keep_connection``)
    died while it waited: the next job begins on a new one, instead of going
    back to the queue with the error and the package failing."""
    postgresql_only()
    services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    connection.close_at = time.monotonic()  # as CONN_MAX_AGE=0 leaves it
    assert run(package) == "completed"
    job = services.enqueue("test.echo", {"n": 2})
    counters.picked_up()
    (package,) = unpack(broker.dequeue())
    close_old_connections()  # what django-q2 does before each task: the connection is kept
    kill_connection()
    assert run(package) == "completed"
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 1 and job.error_type == ""
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]


@override_settings(JOBSTATE={"WORKER_CONN_MAX_AGE": 300})
def test_a_job_run_by_id_after_its_worker_connection_was_killed_runs():
    postgresql_only()
    assert tasks.run_by_id(services.enqueue("test.echo", {}).pk) == "completed"
    job = services.enqueue("test.echo", {"n": 2})
    close_old_connections()
    kill_connection()
    assert tasks.run_by_id(job.pk) == "completed"
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 1 and job.error_type == ""


def refuse_connections(monkeypatch: pytest.MonkeyPatch, error: str = "OperationalError") -> None:
    """The database stops answering: this thread's connection is gone and a new one fails."""
    connection.close()

    def refused(*args: object, **kwargs: object) -> None:
        raise getattr(connection.Database, error)("connection refused")

    monkeypatch.setattr(connection, "get_new_connection", refused)


@pytest.mark.parametrize("error", ["OperationalError", "InterfaceError"])
def test_the_pusher_survives_any_database_error(broker, monkeypatch, error):
    """An InterfaceError (psycopg2's "connection already closed") is no
    DatabaseError: it went up to django-q2's pusher loop, which stops the pusher
    for the sentinel to restart (after 10 s, the leases of jobs waiting in memory
    no longer renewed)."""
    services.enqueue("test.echo", {})
    refuse_connections(monkeypatch, error)
    assert broker.dequeue() is None
    monkeypatch.undo()
    handed = broker.dequeue()
    assert handed is not None and len(handed) == 1


def jobstate_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("jobstate")]


def test_a_pusher_cut_off_from_the_database_logs_one_traceback_then_recovers(broker, monkeypatch, caplog):
    """The database stays unreachable (a restart, a network cut): the pusher
    tries again every poll interval, logging the first failure with its
    traceback, then a line a minute (not a traceback at ERROR every poll), and
    says once that it reached the database again."""
    services.enqueue("test.echo", {})
    refuse_connections(monkeypatch)
    caplog.set_level(logging.INFO, logger="jobstate")
    started = time.monotonic()
    assert [broker.dequeue() for _ in range(5)] == [None] * 5
    assert time.monotonic() - started >= 5 * Conf.POLL  # no busy loop: it waits between tries
    (first,) = jobstate_records(caplog)
    assert first.levelno == logging.ERROR and first.exc_info
    caplog.clear()
    monkeypatch.setattr(outage, "REMIND_SECONDS", 0.0)
    assert broker.dequeue() is None
    (reminder,) = jobstate_records(caplog)
    assert reminder.levelno == logging.WARNING and not reminder.exc_info
    assert "the database still fails (6 attempts in" in reminder.getMessage()
    monkeypatch.undo()
    caplog.clear()
    handed = broker.dequeue()
    assert handed is not None and len(handed) == 1
    assert [r.getMessage() for r in jobstate_records(caplog)] == [
        "jobstate broker: the database answers again after 6 failed attempts"
    ]


def test_a_worker_cut_off_from_the_database_at_its_next_claim_logs_a_traceback_then_recovers(broker, caplog):
    """A worker process that ended a job claims its next one (``tasks.chain``): while
    the database was down it logged a traceback at each of its chained claims. Now
    as the pusher: the first failure with its traceback, then a line a minute, and
    once that it reached the database again."""

    def chain() -> int:
        now = time.monotonic()
        return tasks.chain("host:1:7", hard_deadline=now + 3600, started=now)

    caplog.set_level(logging.INFO, logger="jobstate")
    with pytest.MonkeyPatch.context() as down:  # not undoing the broker fixture's
        refuse_connections(down)
        assert [chain() for _ in range(5)] == [0] * 5
        (first,) = jobstate_records(caplog)
        assert first.levelno == logging.ERROR and first.exc_info
        assert first.getMessage() == "jobstate worker: could not claim a next job; back to django-q2"
        caplog.clear()
        down.setattr(outage, "REMIND_SECONDS", 0.0)
        assert chain() == 0
        (reminder,) = jobstate_records(caplog)
        assert reminder.levelno == logging.WARNING and not reminder.exc_info
        assert "jobstate worker: the database still fails (6 attempts in" in reminder.getMessage()
    caplog.clear()
    services.enqueue("test.echo", {})
    assert chain() == 1
    assert [r.getMessage() for r in jobstate_records(caplog) if "database" in r.getMessage()] == [
        "jobstate worker: the database answers again after 6 failed attempts"
    ]


def test_a_pusher_whose_connection_was_killed_logs_it_once_and_reconnects(broker, caplog):
    """Killed as the pusher records its heartbeat: one traceback (not the
    heartbeat's warning and then the claim's error), and the next call claims."""
    postgresql_only()
    assert broker.dequeue() is None
    kill_connection()
    broker._next_renew = 0.0  # its heartbeat is due: the first call on the dead connection
    caplog.set_level(logging.INFO, logger="jobstate")
    assert broker.dequeue() is None
    (logged,) = jobstate_records(caplog)
    assert logged.levelno == logging.ERROR and logged.exc_info
    services.enqueue("test.echo", {})
    handed = broker.dequeue()
    assert handed is not None and len(handed) == 1


@override_settings(JOBSTATE={"WORKER_CHAIN_SECONDS": 0})  # each attempt its own package
def test_a_connection_killed_before_the_outcome_write_completes_the_job_once(broker, temp_handler):
    """The server ends the worker's session while the handler runs: the outcome
    write fails on it, and is made again on a new connection (guarded by the lease
    token). It was recorded as a failure with that error, and the work that had
    finished ran again."""
    postgresql_only()
    runs: list[int] = []

    def killed_meanwhile(ctx):  # type: ignore[no-untyped-def]
        runs.append(ctx.attempt)
        kill_connection()
        return {"attempt": ctx.attempt}

    temp_handler("t.killed", killed_meanwhile, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.killed", {})
    (package,) = unpack(broker.dequeue())
    assert run(package) == "completed"
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and runs == [1] and job.result == {"attempt": 1}
    assert job.attempts == 1 and job.error_type == ""
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]


def close_at_driver_level() -> None:
    """Close this thread's connection under Django, which does not notice."""
    connection.ensure_connection()
    connection.connection.close()


def kill_from_outside() -> None:
    postgresql_only()
    kill_connection()


@pytest.mark.parametrize("cut", [close_at_driver_level, kill_from_outside])
def test_a_handler_that_finished_on_a_dropped_connection_completes_once(temp_handler, caplog, cut):
    """Its connection gone while it ran (it never used the database again): one
    completion with its result, one history row for it, no retry."""
    runs: list[int] = []

    def finished(ctx):  # type: ignore[no-untyped-def]
        runs.append(ctx.attempt)
        cut()
        return {"rows": 3}

    temp_handler("t.dropped", finished, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.dropped", {})
    (claimed,) = services.claim("w1")
    caplog.set_level(logging.INFO, logger="jobstate")
    assert run_job(claimed, "w1:1") == "completed"
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.error_type) == (Status.COMPLETED, {"rows": 3}, 1, "")
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]
    assert runs == [1] and "its outcome is written again" in caplog.text
    assert "could not be stored" not in caplog.text


@pytest.mark.parametrize("cut", [close_at_driver_level, kill_from_outside])
def test_a_handler_that_raised_on_a_dropped_connection_is_retried_with_its_own_error(temp_handler, cut):
    """The failure record too is written again on a new connection: the attempt is
    retried with the handler's error, not the dropped connection's."""

    def raised(ctx):  # type: ignore[no-untyped-def]
        cut()
        raise ValueError("upstream said no")

    temp_handler("t.dropped_raised", raised, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.dropped_raised", {})
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1:1") == "retrying"
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.QUEUED, "ValueError")
    assert job.error_message == "upstream said no"
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "requeue"]


def restarting_server(monkeypatch: pytest.MonkeyPatch, refusals: int) -> list[str]:
    """From now on this thread's new connections are refused ``refusals`` times (a
    server restarting), then made; returns the refusals so far."""
    real = connection.get_new_connection
    refused: list[str] = []

    def connect(params: Any) -> Any:
        if len(refused) < refusals:
            refused.append("refused")
            raise connection.Database.OperationalError("the database system\n\tis starting up")
        return real(params)

    monkeypatch.setattr(connection, "get_new_connection", connect)
    monkeypatch.setattr(connections, "UNANSWERED_RETRY_SECONDS", 0.01)
    return refused


@pytest.mark.parametrize("cut", [close_at_driver_level, kill_from_outside])
def test_an_outcome_the_restarting_database_refused_is_stored_once_it_answers(
    temp_handler, monkeypatch, caplog, cut
):
    """The server restarts as the handler ends: its connection is gone and new ones
    are refused for a moment. The outcome is tried again while the lease holds, and
    the job completes once. It was given up at the first refusal (two tracebacks),
    and the work that had ended ran again once the reaper requeued it (chaos trial)."""
    runs: list[int] = []
    refused: list[list[str]] = []

    def finished(ctx):  # type: ignore[no-untyped-def]
        runs.append(ctx.attempt)
        cut()
        refused.append(restarting_server(monkeypatch, 3))
        return {"rows": 3}

    temp_handler("t.restarted", finished, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.restarted", {})
    (claimed,) = services.claim("w1")
    caplog.set_level(logging.INFO, logger="jobstate")
    assert run_job(claimed, "w1:1") == "completed"
    monkeypatch.undo()
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.error_type) == (Status.COMPLETED, {"rows": 3}, 1, "")
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]
    assert runs == [1] and refused == [["refused"] * 3]
    logged = [(r.levelno, r.getMessage()) for r in jobstate_records(caplog)]
    assert (logging.INFO, f"Job {job.pk}: its outcome stored once the database answered again") in logged
    waits = [m for _, m in logged if "does not answer" in m]
    assert len(waits) == 1 and re.fullmatch(
        f"Job {job.pk}: the database does not answer \\(OperationalError: the database system is "
        "starting up\\); its outcome \\(ok\\) is tried again for up to 5[45] s",
        waits[0],
    ), waits
    assert not [m for level, m in logged if level >= logging.ERROR]


@pytest.mark.parametrize(
    ("write", "outcome", "status"),
    [("complete", "completed", Status.COMPLETED), ("fail_held", "retrying", Status.QUEUED)],
)
def test_an_outcome_committed_just_before_the_connection_dropped_is_reported_as_stored(
    temp_handler, monkeypatch, caplog, write, outcome, status
):
    """The outcome write commits, then its connection drops before the answer comes
    back: written again on a new connection, it is refused (the job left
    ``processing``). The attempt's outcome is what the first write stored, for the
    runner's hooks too; it was reported as a lost lease."""
    real = getattr(services, write)
    writes: list[int] = []

    def committed_then_dropped(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        writes.append(1)
        if len(writes) > 1:
            return real(job, *args, **kwargs)
        real(copy.copy(job), *args, **kwargs)  # committed; the worker never hears of it
        close_at_driver_level()
        raise OperationalError("server closed the connection unexpectedly")

    def handler(ctx):  # type: ignore[no-untyped-def]
        if write == "fail_held":
            raise ValueError("upstream said no")
        return {"rows": 3}

    temp_handler("t.committed", handler, max_attempts=3, retry_backoff=0)
    ended: list[str] = []

    def record(ctx: Any, result: str) -> None:
        ended.append(result)

    job = services.enqueue("t.committed", {})
    (claimed,) = services.claim("w1")
    monkeypatch.setattr(services, write, committed_then_dropped)
    hooks.attempt_ended.register(record)
    caplog.set_level(logging.INFO, logger="jobstate")
    try:
        assert run_job(claimed, "w1:1") == outcome
    finally:
        hooks.attempt_ended.unregister(record)
    assert writes == [1, 1] and ended == [outcome]
    job.refresh_from_db()
    assert job.status == status
    # The retry is logged as stored; when it runs again is not known (the answer was lost).
    logged = [r.getMessage() for r in caplog.records if r.name == "jobstate.worker" and hasattr(r, "outcome")]
    assert logged == (
        [f"Job {job.pk} (t.committed) attempt 1 of 3 failed; runs again later: ValueError: upstream said no"]
        if outcome == "retrying"
        else []
    )
    assert list(job.events.values_list("to_status", flat=True))[2:] == [status]


def test_a_worker_heartbeat_cut_off_from_the_database_logs_one_traceback_then_recovers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker process's heartbeat thread records the process every
    HEARTBEAT_SECONDS: while the database is down it logged a traceback at ERROR
    at each beat. Now as the pusher: the first failure with its traceback, then a
    line a minute, and once that it reached the database again."""
    from jobstate.models import WorkerProcess
    from jobstate.worker.supervisor import supervisor

    sup = supervisor()
    refuse_connections(monkeypatch)
    caplog.set_level(logging.INFO, logger="jobstate")
    for _ in range(5):
        sup._beat_process_as(None, "host:1:7", "host:1")
    (first,) = jobstate_records(caplog)
    assert first.levelno == logging.ERROR and first.exc_info
    assert first.getMessage().startswith("jobstate worker heartbeat: failed for host:1:7")
    caplog.clear()
    monkeypatch.setattr(outage, "REMIND_SECONDS", 0.0)
    sup._beat_process_as(None, "host:1:7", "host:1")
    (reminder,) = jobstate_records(caplog)
    assert reminder.levelno == logging.WARNING and not reminder.exc_info
    assert "the database still fails (6 attempts in" in reminder.getMessage()
    monkeypatch.undo()
    caplog.clear()
    sup._beat_process_as(None, "host:1:7", "host:1")
    assert WorkerProcess.objects.filter(name="host:1:7", role="worker").exists()
    assert [r.getMessage() for r in jobstate_records(caplog)] == [
        "jobstate worker heartbeat: the database answers again after 6 failed attempts"
    ]


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 10})
@pytest.mark.parametrize("write", ["lease", "progress"])
def test_a_job_heartbeat_cut_off_from_the_database_logs_one_traceback_then_recovers(
    write: str, temp_handler: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The running job's lease renewal and its pending progress write logged a
    traceback at ERROR at each beat while the database was down. Now as the
    process heartbeat: the first failure with its traceback, then a line a
    minute, and once that it reached the database again."""
    from jobstate import registry
    from jobstate.worker.context import JobContext
    from jobstate.worker.slot import Slot
    from jobstate.worker.supervisor import supervisor

    temp_handler("t.cut_off", lambda ctx: None)
    services.enqueue("t.cut_off", {})
    (job,) = services.claim("w1")
    ctx = JobContext(job, registry.get_handler("t.cut_off"), "w1:1")
    ctx.progress(10, "first")  # written at once
    ctx.progress(20, "second")  # due in 10 s: the heartbeat writes it
    slot = Slot(ctx, 60.0, interruptible=False)
    sup = supervisor()
    sup._job_outage.failures = sup._flush_outage.failures = 0  # a run of failures of its own
    beat = sup._beat_job if write == "lease" else sup._flush

    refuse_connections(monkeypatch)
    caplog.set_level(logging.INFO, logger="jobstate")
    for _ in range(5):
        beat(slot)
    (first,) = jobstate_records(caplog)
    assert first.levelno == logging.ERROR and first.exc_info
    expected = "Heartbeat failed for job" if write == "lease" else "Progress of job"
    assert expected in first.getMessage()
    caplog.clear()
    monkeypatch.setattr(outage, "REMIND_SECONDS", 0.0)
    beat(slot)
    (reminder,) = jobstate_records(caplog)
    assert reminder.levelno == logging.WARNING and not reminder.exc_info
    assert "the database still fails (6 attempts in" in reminder.getMessage()
    monkeypatch.undo()
    caplog.clear()
    beat(slot)
    what = "jobstate job heartbeat" if write == "lease" else "jobstate progress"
    assert [r.getMessage() for r in jobstate_records(caplog)] == [
        f"{what}: the database answers again after 6 failed attempts"
    ]
    assert not ctx.lease_lost.is_set()
    job.refresh_from_db()
    assert job.progress == (10 if write == "lease" else 20)


def test_a_job_claimed_with_an_outcome_whose_answer_was_lost_runs_next(broker, temp_handler, monkeypatch):
    """On PostgreSQL a completion claims and begins the worker's next job in the
    same statement (``services.handover``). That statement commits, then the
    connection drops before its answer comes back: the completion made again is
    refused, and claims nothing. The job it had claimed is run next, once, its one
    attempt charged; it stayed ``processing`` under this worker, never run, until
    the reaper took it with that attempt spent."""
    postgresql_only()
    from jobstate.services import handover

    runs: list[int] = []
    temp_handler("t.handed", lambda ctx: runs.append(ctx.attempt), max_attempts=2, retry_backoff=0)
    services.enqueue("t.handed", {})
    (package,) = unpack(broker.dequeue())
    following = services.enqueue("t.handed", {"n": 2})
    real = handover.move_and_claim
    claimed: list[Any] = []

    def committed_then_dropped(job, *args, then, **kwargs):  # type: ignore[no-untyped-def]
        if claimed:
            return real(job, *args, then=then, **kwargs)
        unheard = services.NextClaim(then.worker_id, then.kinds)
        real(copy.copy(job), *args, then=unheard, **kwargs)  # committed; the worker never hears of it
        claimed.extend(unheard.claimed)
        close_at_driver_level()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(handover, "move_and_claim", committed_then_dropped)
    # Only kinds without a concurrency limit can be claimed with an outcome.
    kinds = tasks.Chain.next_kinds
    monkeypatch.setattr(tasks.Chain, "next_kinds", lambda links: [k for k in kinds(links) if k == "t.handed"])
    assert run(package) == "completed"
    assert [job.pk for job in claimed] == [following.pk]
    following.refresh_from_db()
    assert following.status == Status.COMPLETED and following.attempts == 1 and runs == [1, 1]
    assert list(following.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]


@pytest.mark.parametrize("write", ["begin", "start"])
def test_a_job_begun_just_before_the_connection_dropped_runs(broker, temp_handler, monkeypatch, write):
    """``begin`` (a package's job) or ``start`` (``run_by_id``) commits, then the
    connection drops before its answer comes back: made again on a new one, it is
    refused (the job shows as started). Still held by this worker process (under
    its lease token), the job runs, its one attempt charged; it was skipped as
    "taken from this cluster", left ``processing`` for the reaper to take with
    that attempt spent."""
    runs: list[int] = []
    temp_handler("t.begun", lambda ctx: runs.append(ctx.attempt), max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.begun", {})
    real = getattr(services, write)
    calls: list[int] = []

    def committed_then_dropped(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 1:
            return real(*args, **kwargs)
        real(*args, **kwargs)  # committed; the worker never hears of it
        close_at_driver_level()
        raise OperationalError("server closed the connection unexpectedly")

    if write == "begin":
        (package,) = unpack(broker.dequeue())
    monkeypatch.setattr(services, write, committed_then_dropped)
    assert (run(package) if write == "begin" else tasks.run_by_id(job.pk)) == "completed"
    assert calls == [1, 1] and runs == [1]
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 1
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]


def test_a_job_begun_then_taken_by_another_worker_before_the_begin_made_again_is_skipped(
    broker, temp_handler, monkeypatch
):
    """The same, but the reaper gave the job to another worker before ``begin``
    was made again: it is not this worker's to run (another lease token, holder)."""
    runs: list[int] = []
    temp_handler("t.taken", lambda ctx: runs.append(ctx.attempt), max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.taken", {})
    (package,) = unpack(broker.dequeue())
    real = services.begin
    calls: list[int] = []

    def committed_then_taken(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 1:
            return real(*args, **kwargs)
        real(*args, **kwargs)  # committed; then the worker's lease ran out, and another took it
        Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
        services.requeue_expired()
        services.claim("other:1:2", kinds=["t.taken"], start=True)
        close_at_driver_level()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "begin", committed_then_taken)
    assert run(package) == "skipped"
    assert calls == [1, 1] and runs == []
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.worker_id == "other:1:2"


@pytest.mark.parametrize("how", ["returned", "partial"])
def test_an_unstorable_result_whose_failure_committed_before_the_connection_dropped_is_logged(
    temp_handler, monkeypatch, caplog, how
):
    """The failure of a result that cannot be stored commits, its answer is lost:
    written again, it is refused; the outcome stored is logged with its error, as
    when the answer came. Nothing was logged (the outcome was read as the handler's:
    a completion, or a Partial stored)."""
    real = services.fail_held
    writes: list[int] = []

    def committed_then_dropped(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        writes.append(1)
        if len(writes) > 1:
            return real(job, *args, **kwargs)
        real(copy.copy(job), *args, **kwargs)  # committed; the worker never hears of it
        close_at_driver_level()
        raise OperationalError("server closed the connection unexpectedly")

    def unstorable(ctx):  # type: ignore[no-untyped-def]
        if how == "partial":
            raise Partial("2 of 3", result={"when": {1, 2}})  # a set: not JSON
        return {"when": {1, 2}}

    temp_handler("t.unstorable", unstorable, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.unstorable", {})
    (claimed,) = services.claim("w1")
    monkeypatch.setattr(services, "fail_held", committed_then_dropped)
    caplog.set_level(logging.INFO, logger="jobstate")
    assert run_job(claimed, "w1:1") == "failed"
    assert writes == [1, 1]
    job.refresh_from_db()
    assert (job.status, job.error_type) == (Status.FAILED, "UnstorableResult")
    (line,) = [r for r in caplog.records if r.name == "jobstate.worker" and hasattr(r, "outcome")]
    assert line.levelno == logging.ERROR and line.error_type == "UnstorableResult"  # type: ignore[attr-defined]
    assert (
        line.getMessage()
        == f"Job {job.pk} (t.unstorable) failed on attempt 1 of 3: UnstorableResult: {job.error_message}"
    )


@override_settings(JOBSTATE={"LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.2})
def test_an_outcome_the_database_never_took_is_left_to_the_reaper_with_one_traceback(
    temp_handler, monkeypatch, caplog
):
    """The database stays down past the lease: the worker stops trying before the
    lease runs out (the reaper may give the job to another worker from then on) and
    says so in one ERROR line with the traceback (it logged two, the outcome's and
    the failure's, for one cause)."""

    def finished(ctx):  # type: ignore[no-untyped-def]
        close_at_driver_level()
        restarting_server(monkeypatch, 10**6)
        return {"rows": 3}

    temp_handler("t.never", finished, max_attempts=3, retry_backoff=0)
    job = services.enqueue("t.never", {})
    (claimed,) = services.claim("w1")
    caplog.set_level(logging.INFO, logger="jobstate")
    started = time.monotonic()
    assert run_job(claimed, "w1:1") == "lost"
    assert time.monotonic() - started < 1.0  # given up before the lease ran out
    monkeypatch.undo()
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.attempts == 1
    errors = [r for r in jobstate_records(caplog) if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"Job {job.pk}: its outcome (ok) could not be stored: the database did not answer "
        "before its lease ran out; the reaper will take it"
    ]
    assert errors[0].exc_info


def test_an_outcome_that_waited_for_the_database_claims_no_next_job_with_it(temp_handler, monkeypatch):
    """A next job claimed with an outcome begins under a lease (and a django-q2 hard
    limit) counted from when the outcome was first asked: after a wait for the
    database most of it was spent, and the watchdog interrupted the next job at
    once (review). After a wait the outcome is written alone; the worker claims
    its next job itself."""
    postgresql_only()

    def finished(ctx):  # type: ignore[no-untyped-def]
        close_at_driver_level()
        restarting_server(monkeypatch, 3)
        return {"rows": 3}

    temp_handler("t.waited", finished, max_attempts=3, retry_backoff=0)
    temp_handler("t.next", lambda ctx: None)
    job = services.enqueue("t.waited", {})
    (claimed,) = services.claim("w1", kinds=["t.waited"])
    following = services.enqueue("t.next", {})
    asked: list[services.NextClaim] = []

    def then() -> services.NextClaim:
        asked.append(services.NextClaim("w1:1", ["t.next"]))
        return asked[-1]

    assert run_job(claimed, "w1:1", then) == "completed"
    monkeypatch.undo()
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED
    assert [(request.tried, request.claimed) for request in asked] == [(False, [])]
    assert Job.objects.get(pk=following.pk).status == Status.QUEUED


@override_settings(
    JOBSTATE={"HEARTBEAT_SECONDS": 1, "CANCEL_GRACE_SECONDS": 0.5, "HARD_KILL_MARGIN_SECONDS": 0.5}
)
def test_an_outcome_is_not_tried_again_past_django_q2s_hard_limit(temp_handler, monkeypatch):
    """django-q2 kills a worker process at the job's hard limit (its timeout, the
    cancel grace and a margin): a write still waiting for the database then died
    mid-call, however long the lease had left (review). It stops before it."""

    def finished(ctx):  # type: ignore[no-untyped-def]
        close_at_driver_level()
        restarting_server(monkeypatch, 10**6)
        return {"rows": 3}

    temp_handler("t.hard", finished, timeout=1)  # hard limit 2 s; the lease runs 60
    job = services.enqueue("t.hard", {})
    (claimed,) = services.claim("w1")
    started = time.monotonic()
    assert run_job(claimed, "w1:1") == "lost"
    assert time.monotonic() - started < 2.0
    monkeypatch.undo()
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING  # left to the reaper


def test_a_failure_long_after_the_last_one_starts_a_new_run_with_its_traceback(monkeypatch, caplog):
    """A worker's chained claim calls rarely and may never have called ``ended`` since
    its last failure, though the database answered meanwhile: a failure hours later
    was logged as the same outage going on ("still fails (2 attempts in 7200 s)"),
    without its traceback (review)."""
    run = outage.Outage(logging.getLogger("jobstate.worker"), "jobstate worker")
    caplog.set_level(logging.INFO, logger="jobstate")
    run.failed("could not claim a next job", OperationalError("first"))
    monkeypatch.setattr(outage, "QUIET_SECONDS", 0.0)
    time.sleep(0.01)
    run.failed("could not claim a next job", OperationalError("second"))
    errors = [r for r in jobstate_records(caplog) if r.levelno == logging.ERROR]
    assert [str(r.exc_info[1]) for r in errors] == ["first", "second"]
    assert run.failures == 1
