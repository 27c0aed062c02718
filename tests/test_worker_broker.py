"""The django-q2 glue in-process: JobBroker packages, prefetch room, execute()."""

from __future__ import annotations

import os
import pickle
import pydoc
import time
from datetime import timedelta
from uuid import UUID

import pytest
from django.db import OperationalError, close_old_connections, connection
from django.test import override_settings
from django.utils import timezone
from django_q.conf import Conf
from django_q.exceptions import TimeoutException
from django_q.models import OrmQ
from django_q.signals import pre_execute
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from jobstate import hooks, registry, services
from jobstate.exceptions import ConcurrencyLimitReached
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from jobstate.worker import broker as broker_module
from jobstate.worker import counters, runner, tasks
from jobstate.worker.cluster import cluster_id
from jobstate.worker.leases import max_wait
from jobstate.worker.packages import EXECUTE
from jobstate.worker.runner import hard_limit_for, run_next

pytestmark = pytest.mark.django_db(transaction=True)


def unpack(tasks_: list) -> list[dict]:  # type: ignore[type-arg]
    return [SignedPackage.loads(payload) for _ack, payload in tasks_]


def claim_then_expire(worker_id: str) -> None:
    """A worker claims and dies: its lease ran out a minute ago."""
    (job,) = services.claim(worker_id)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))


def run(package: dict) -> str:  # type: ignore[type-arg]
    """What a django-q2 worker does with a package."""
    return pydoc.locate(package["func"])(*package["args"], **package["kwargs"])  # type: ignore[misc]


@override_settings(JOBSTATE={"PREFETCH": 10, "WORKER_CHAIN_SECONDS": 2})  # the default's room
def test_dequeue_claims_a_batch_as_signed_packages(broker):
    jobs = [services.enqueue("test.echo", {"n": i}) for i in range(3)]
    handed = broker.dequeue()
    assert [ack for ack, _ in handed] == [f"job:{job.pk}" for job in jobs]
    packages = unpack(handed)
    for job, package in zip(jobs, packages, strict=True):
        # Slim: id, lease token and kind; nothing pickled from the model.
        job_id, token, kind = package["args"]
        assert package["func"] == EXECUTE and package["kwargs"] == {}
        assert package["save"] is False and package["ack_failure"] is True
        # Its own hard limit, plus room for the jobs the worker may chain after it.
        assert package["timeout"] == hard_limit_for(registry.get_handler("test.echo")) + 3
        claimed = Job.objects.get(pk=job_id)
        assert (job_id, token, kind) == (str(job.pk), str(claimed.lease_token), "test.echo")
        assert claimed.status == Status.PROCESSING and claimed.started_at is None and claimed.attempts == 0
    assert set(Job.objects.values_list("status", "worker_id")) == {(Status.PROCESSING, cluster_id())}
    assert cluster_id() == f"{os.uname().nodename}:{os.getppid()}"


@override_settings(JOBSTATE={"PREFETCH": 10})
def test_a_broker_unpickled_in_a_spawned_pusher_claims_and_renews(broker):
    # django-q2 pickles only the list key and info; a pusher started by "spawn"
    # (macOS's default) gets the broker that way, and its first dequeue renews leases.
    job = services.enqueue("test.echo", {})
    copy = pickle.loads(pickle.dumps(broker))
    handed = copy.dequeue()
    assert [ack for ack, _ in handed] == [f"job:{job.pk}"]
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING


@override_settings(JOBSTATE={"PREFETCH": 2})
def test_claims_only_what_fits_under_the_prefetch_limit(broker):
    for _ in range(5):
        services.enqueue("test.echo", {})
    assert len(broker.dequeue()) == 2
    assert broker.dequeue() is None  # full: nothing more until a worker picks one up
    assert Job.objects.processing().count() == 2
    counters.picked_up()
    assert len(broker.dequeue()) == 1
    assert Job.objects.queued().count() == 2


def test_prefetch_is_one_job_per_idle_worker_process(broker):
    assert broker.prefetch(now=100.0) == 2  # both worker processes idle
    counters.picked_up()  # one takes a package: busy until it returns
    assert broker.prefetch(now=100.0) == 1
    counters.picked_up()
    assert broker.prefetch(now=100.0) == 0  # both busy: they claim their next jobs themselves
    counters.done()
    assert broker.prefetch(now=100.0) == 1
    with override_settings(JOBSTATE={"PREFETCH": 3}):
        assert broker.prefetch(now=100.0) == 3


def test_the_slot_of_a_worker_killed_inside_execute_is_freed(broker):
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a worker process that took a package and was killed: its pid is free
    assert counters.busy is not None
    counters.busy.enter(gone.pid)
    counters.picked_up()  # this process: alive, inside execute
    broker._next_forget = float("inf")
    assert broker.prefetch(now=100.0) == 0  # both slots look busy until the next look
    broker._next_forget = 0
    assert broker.prefetch(now=100.0) == 1  # the dead one's slot is freed, not the live one's
    assert counters.busy.count() == 1
    counters.done()
    assert counters.busy.count() == 0


@override_settings(JOBSTATE={"PREFETCH": 2})
def test_a_leaked_pending_count_is_corrected_from_the_database(broker):
    for _ in range(3):
        services.enqueue("test.echo", {})
    handed = broker.dequeue()
    assert len(handed) == 2
    # The pusher "died" with these two: an operator puts them back.
    for ack, _payload in handed:
        services.requeue(ack.removeprefix("job:"), "admin", "pusher lost")
    assert len(broker.dequeue()) == 2


@override_settings(JOBSTATE={"PREFETCH": 2, "LEASE_SECONDS": 60})
def test_leases_of_jobs_waiting_in_memory_are_renewed(broker):
    for _ in range(3):
        services.enqueue("test.echo", {})
    waiting, started = (ack.removeprefix("job:") for ack, _ in broker.dequeue())
    assert broker.dequeue() is None  # full: the third stays queued
    services.heartbeat(started, Job.objects.get(pk=started).lease_token, worker_id="host:1:2")
    soon = timezone.now() + timedelta(seconds=1)
    Job.objects.filter(pk__in=[waiting, started]).update(lease_expires_at=soon)
    broker._next_renew = 0  # a heartbeat interval has passed
    broker.dequeue()
    renewed = dict(Job.objects.values_list("pk", "lease_expires_at"))
    assert renewed[UUID(waiting)] > soon + timedelta(seconds=50)
    assert renewed[UUID(started)] == soon  # a running job's own heartbeat renews it


def test_execute_runs_the_job_in_this_worker_process(broker):
    job = services.enqueue("test.echo", {"x": 1})
    (package,) = unpack(broker.dequeue())
    assert run(package) == "completed"
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"echo": {"x": 1}}
    me = f"{cluster_id()}:{os.getpid()}"
    assert job.worker_id == me
    assert job.events.get(transition="claim").actor_label == f"worker:{cluster_id()}"
    assert job.events.get(transition="complete").actor_label == f"worker:{me}"


@override_settings(JOBSTATE={"WORKER_CONN_MAX_AGE": 300})
def test_execute_keeps_the_worker_connection_for_the_next_job(broker):
    services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    connection.close_at = time.monotonic()  # as CONN_MAX_AGE=0 leaves it
    run(package)
    used = connection.connection
    close_old_connections()  # what django-q2 does before each task
    assert connection.connection is used is not None


@override_settings(JOBSTATE={"WORKER_CHAIN_SECONDS": 0})  # the package's own path; no chain after it
def test_execute_skips_a_job_taken_away_while_it_waited(broker):
    job = services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    services.requeue(job, "admin", "taken back")
    assert run(package) == "skipped"
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.worker_id == ""
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "requeue"]


def test_execute_cancels_a_job_whose_cancel_came_before_it_started(broker, temp_handler):
    ran = []
    temp_handler("t.never", lambda ctx: ran.append(1))
    job = services.enqueue("t.never", {})
    (package,) = unpack(broker.dequeue())
    services.request_cancel(job, "api", "too late anyway")
    assert run(package) == "cancelled"
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and ran == []


def test_django_q_hard_timeout_fails_the_attempt_and_recycles_the_worker(broker, temp_handler):
    def stuck(ctx):
        raise TimeoutException("Task exceeded maximum timeout value")  # what SIGALRM raises

    temp_handler("t.stuck", stuck, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.stuck", {})
    (package,) = unpack(broker.dequeue())
    with pytest.raises(TimeoutException):
        run(package)  # django-q2 then replaces this worker process
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.error_type == "HardTimeout" and job.attempts == 1


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60})
def test_django_q_hard_timeout_stores_the_pending_progress(broker, temp_handler):
    # Every other ending stored the last coalesced report; the hard limit dropped it,
    # and the job showed "starting", not where its handler got stuck.
    def stuck(ctx):
        ctx.progress(10, "starting")  # written at once
        ctx.progress(70, "writing the archive")  # kept for the outcome
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.stuck", stuck, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.stuck", {})
    (package,) = unpack(broker.dequeue())
    ended: list[str] = []

    def observe(ctx: object, outcome: str) -> None:
        ended.append(outcome)

    hooks.attempt_ended.register(observe)
    try:
        with pytest.raises(TimeoutException):
            run(package)
    finally:
        hooks.attempt_ended.unregister(observe)
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.error_type == "HardTimeout" and job.attempts == 1
    assert (job.progress, job.progress_message) == (70, "writing the archive")
    assert ended == ["retrying"]  # what was stored, no longer "lost"
    assert [e.transition for e in job.events.order_by("id")] == ["enqueue", "claim", "requeue"]


def test_django_q_hard_timeout_right_after_a_retry_was_stored_leaves_the_retry(
    broker, temp_handler, monkeypatch
):
    # The requeue cleared the job's lease token; the hard limit's record went out
    # without one, which no guard refused, and ended the queued job failed.
    def boom(ctx):
        raise ValueError("bad row")

    real = services.fail_held  # the worker's fail

    def stored_then_alarm(*args, **kwargs):  # type: ignore[no-untyped-def]
        real(*args, **kwargs)
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.boom", boom, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.boom", {})
    (package,) = unpack(broker.dequeue())
    monkeypatch.setattr(services, "fail_held", stored_then_alarm)
    with pytest.raises(TimeoutException):
        run(package)
    job.refresh_from_db()
    assert (job.status, job.error_type, job.attempts) == (Status.QUEUED, "ValueError", 1)
    assert [e.transition for e in job.events.order_by("id")] == ["enqueue", "claim", "requeue"]


def test_django_q_hard_timeout_of_a_job_run_by_id_fails_the_attempt(temp_handler):
    def stuck(ctx):
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.stuck", stuck, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.stuck", {})
    with pytest.raises(TimeoutException):
        tasks.run_by_id(str(job.pk))
    job.refresh_from_db()  # not left processing for the reaper
    assert job.status == Status.QUEUED and job.error_type == "HardTimeout" and job.attempts == 1


def test_plain_django_q_tasks_ride_the_orm_queue(broker):
    async_task("jobstate.worker.tasks.reap", broker=broker)
    (row,) = OrmQ.objects.all()
    handed = broker.dequeue()
    assert [ack for ack, _ in handed] == [row.pk]
    assert unpack(handed)[0]["func"] == "jobstate.worker.tasks.reap"
    broker.acknowledge(f"job:{row.pk}")  # a job ack never touches django-q2's queue
    assert OrmQ.objects.filter(pk=row.pk).exists()
    broker.acknowledge(row.pk)
    assert not OrmQ.objects.exists()


@override_settings(JOBSTATE={"REAP_INTERVAL_SECONDS": 5})
def test_dequeue_rescues_expired_leases_before_claiming(broker):
    job = services.enqueue("test.echo", {})
    claim_then_expire("dead-host:1")
    handed = broker.dequeue()
    assert [ack for ack, _ in handed] == [f"job:{job.pk}"]
    labels = list(job.events.order_by("created_at", "id").values_list("transition", "actor_label"))
    assert labels == [
        ("enqueue", "system"),
        ("claim", "worker:dead-host:1"),
        ("requeue", "system:reaper"),
        ("claim", f"worker:{cluster_id()}"),
    ]


def test_idle_dequeue_returns_nothing_and_sizes_count_jobs(broker):
    assert broker.dequeue() is None
    services.enqueue("test.echo", {})
    services.enqueue("test.echo", {}, run_after=timezone.now() + timedelta(hours=1))
    assert (broker.queue_size(), broker.lock_size()) == (1, 0)
    broker.dequeue()
    assert (broker.queue_size(), broker.lock_size()) == (0, 1)
    assert broker.ping() is True


def test_run_by_id_is_the_id_only_alternative():
    job = services.enqueue("test.echo", {"id": "only"})
    assert tasks.run_by_id(str(job.pk)) == "completed"
    assert tasks.run_by_id(str(job.pk)) == "skipped"  # a second delivery changes nothing
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.attempts == 1


def test_starting_a_job_by_id_respects_its_kinds_concurrency_limit(temp_handler):
    seen: list[int] = []
    running = lambda ctx: seen.append(Job.objects.filter(kind="t.one", status=Status.PROCESSING).count())  # noqa: E731
    temp_handler("t.one", running, concurrency=1)
    first = services.enqueue("t.one", {})
    second = services.enqueue("t.one", {})
    (elsewhere,) = services.claim("other:1", kinds=["t.one"], start=True)  # one runs elsewhere
    assert elsewhere.pk == first.pk
    with pytest.raises(ConcurrencyLimitReached, match="concurrency limit"):
        services.start(second, "w1")
    assert tasks.run_by_id(str(second.pk)) == "skipped"
    assert seen == [] and Job.objects.get(pk=second.pk).status == Status.QUEUED  # the broker takes it later
    services.complete(elsewhere, elsewhere.lease_token, {})
    assert tasks.run_by_id(str(second.pk)) == "completed" and seen == [1]


@override_settings(JOBSTATE={"PROGRESS_FLUSH_SECONDS": 60})
@pytest.mark.parametrize("func", ["run_by_id", "execute"])
def test_ctrl_c_in_a_task_django_q2_runs_in_sync_mode_hands_the_job_back(temp_handler, func):
    # Q_CLUSTER sync=True runs the task inside the caller (a shell, a script),
    # whose Ctrl-C reaches the handler: it was recorded as the handler's error,
    # and a job with one attempt ended failed with KeyboardInterrupt.
    def interrupted(ctx):
        ctx.progress(10, "starting")  # written at once
        ctx.progress(40, "reading")  # pending: stored with the hand-back
        raise KeyboardInterrupt

    temp_handler("t.sync_ctrl_c", interrupted, max_attempts=1)
    job = services.enqueue("t.sync_ctrl_c", {})
    if func == "run_by_id":
        args = [str(job.pk)]
    else:
        (claimed,) = services.claim(cluster_id())
        args = [str(job.pk), str(claimed.lease_token), claimed.kind]
    with pytest.raises(KeyboardInterrupt):
        async_task(f"jobstate.worker.tasks.{func}", *args, sync=True)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error_type, job.worker_id) == (Status.QUEUED, 0, "", "")
    assert (job.progress, job.progress_message) == (40, "reading")
    requeue = job.events.order_by("id").last()
    assert requeue.transition == "requeue" and requeue.metadata.get("handed_back") is True
    assert requeue.reason.startswith("stopped by Ctrl-C (KeyboardInterrupt)")


@pytest.mark.parametrize("committed", [False, True])
def test_ctrl_c_in_the_begin_of_a_task_django_q2_runs_in_sync_mode_hands_the_job_back(
    temp_handler, monkeypatch, committed
):
    # execute() begins the job itself, before run_job: a Ctrl-C there left it
    # processing until its lease ran out, and a begun one (its attempt spent) to the
    # reaper, which failed a job of one attempt "worker lost" though it never ran.
    temp_handler("t.sync_begin_ctrl_c", lambda ctx: {"done": True}, max_attempts=1)
    job = services.enqueue("t.sync_begin_ctrl_c", {})
    (claimed,) = services.claim(cluster_id())
    real = services.begin

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        if committed:
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(services, "begin", interrupted)
    with pytest.raises(KeyboardInterrupt):
        async_task(EXECUTE, str(job.pk), str(claimed.lease_token), claimed.kind, sync=True)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id, job.lease_token) == (Status.QUEUED, 0, "", None)
    assert job.events.order_by("id").last().metadata.get("handed_back") is True
    monkeypatch.undo()
    assert run_next("w") is not None
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 1)


def test_starting_a_job_by_id_honours_a_pending_cancel_request(temp_handler):
    ran: list[int] = []
    temp_handler("t.cancelme", lambda ctx: ran.append(1))
    job = services.enqueue("t.cancelme", {})
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())  # requested, not yet honoured
    assert tasks.run_by_id(str(job.pk)) == "skipped"
    job.refresh_from_db()
    assert ran == [] and job.status == Status.CANCELLED and job.attempts == 0
    assert job.events.order_by("-id").values_list("transition", "reason")[0] == (
        "cancel",
        "cancel requested before it started",
    )


@pytest.mark.django_db(transaction=True)
def test_a_hard_limit_right_after_a_claim_hands_the_unstarted_job_back(broker, temp_handler, monkeypatch):
    # django-q2's alarm lands as the worker process claims its next job for itself
    # (claimed and begun, its attempt charged), before that job's handler starts.
    ran: list[int] = []
    temp_handler("t.a", lambda ctx: "a")
    # A concurrency limit: never claimed with the outcome (services.handover), but by the
    # worker's own claim.
    temp_handler("t.b", lambda ctx: ran.append(1), max_attempts=1, concurrency=5)
    real = services.claim

    def alarm_right_after(*args, **kwargs):
        claimed = real(*args, **kwargs)
        if kwargs.get("start") and claimed:
            raise TimeoutException("django-q2 hard limit")
        return claimed

    monkeypatch.setattr(services, "claim", alarm_right_after)
    first = services.enqueue("t.a", {})
    (package,) = unpack(broker.dequeue())
    second = services.enqueue("t.b", {})
    with pytest.raises(TimeoutException):
        run(package)
    assert Job.objects.get(pk=first.pk).status == Status.COMPLETED
    second.refresh_from_db()
    # Back in the queue with its attempt refunded, not left to the reaper, which
    # would have failed it ("worker lost") without it ever running.
    assert (second.status, second.attempts, second.worker_id) == (Status.QUEUED, 0, "")
    last = second.events.order_by("-id").values_list("transition", "reason")[0]
    assert last == ("requeue", tasks.UNSTARTED)
    monkeypatch.setattr(services, "claim", real)
    services.requeue_expired(timezone.now() + timedelta(hours=2))
    assert run_next("w2") is not None and ran == [1]
    assert Job.objects.get(pk=second.pk).status == Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_a_held_job_read_without_a_lease_token_is_skipped_and_the_others_handed_back(
    temp_handler, monkeypatch, caplog
):
    # A processing row always has a token (a constraint); one read without it (a
    # job copy whose token was cleared) has nothing to guard the hand-back with.
    # It is left to the reaper, the other unstarted jobs still go back.
    temp_handler("t.unstarted", lambda ctx: None)
    links = tasks.Chain("me:1", time.monotonic() + 60, time.monotonic())
    for _ in range(2):
        services.enqueue("t.unstarted", {})
    assert len(services.claim("me:1", limit=2, start=True)) == 2
    real = Job.from_db
    cleared: list[Job] = []

    # A classmethod, as Django's own: Django 6.1 reads from_db.__func__.
    @classmethod  # type: ignore[misc]
    def first_without_token(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        job = real(*args, **kwargs)
        if not cleared:
            job.lease_token = None
            cleared.append(job)
        return job

    monkeypatch.setattr(Job, "from_db", first_without_token)
    with caplog.at_level("WARNING", logger="jobstate"):
        tasks.hand_back_unstarted("me:1", links)
    monkeypatch.setattr(Job, "from_db", classmethod(real.__func__))
    (skipped,) = cleared
    rows = {job.pk: (job.status, job.attempts) for job in Job.objects.all()}
    assert rows.pop(skipped.pk) == (Status.PROCESSING, 1)  # left to the reaper
    assert list(rows.values()) == [(Status.QUEUED, 0)]  # handed back, its attempt refunded
    assert f"Job {skipped.pk}: no lease token to hand it back with" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_hard_limit_hands_back_only_the_job_whose_handler_has_not_started(
    broker, temp_handler, monkeypatch
):
    # A's handler ran but its outcome could not be stored (left to the reaper, its
    # attempt spent); B ran; the alarm lands as C is claimed: only C goes back.
    ran: list[str] = []
    temp_handler("t.a", lambda ctx: ran.append("a"))
    temp_handler("t.b", lambda ctx: ran.append("b"))
    temp_handler("t.c", lambda ctx: ran.append("c"), concurrency=5)  # the worker's own claim
    real_finish = runner.finish

    def finish(ctx, kind, value, then=None):
        if ctx.job.kind == "t.a":
            return "lost"  # outcome could not be stored: left to the reaper
        return real_finish(ctx, kind, value, then=then)

    monkeypatch.setattr(runner, "finish", finish)
    real_claim = services.claim
    calls = {"n": 0}

    def claim(*args, **kwargs):
        claimed = real_claim(*args, **kwargs)
        if kwargs.get("start") and claimed:
            calls["n"] += 1
            if calls["n"] == 2:
                raise TimeoutException("django-q2 hard limit")
        return claimed

    monkeypatch.setattr(services, "claim", claim)
    a = services.enqueue("t.a", {})
    (package,) = unpack(broker.dequeue())
    services.enqueue("t.b", {})
    services.enqueue("t.c", {})
    with pytest.raises(TimeoutException):
        run(package)
    assert ran == ["a", "b"]
    a.refresh_from_db()
    assert (a.status, a.attempts) == (Status.PROCESSING, 1)
    c = Job.objects.get(kind="t.c")
    assert (c.status, c.attempts) == (Status.QUEUED, 0)


def test_scheduled_task_targets_report_counts():
    services.enqueue("test.echo", {})
    claim_then_expire("gone:1")
    assert tasks.reap() == {"requeued": 1, "failed": 0, "cancelled": 0}
    assert tasks.prune(days=0) == {"jobs": 0, "events": 0, "assets": 0}


def test_the_scheduled_reap_says_when_more_remain(monkeypatch):
    for n in range(2):
        services.enqueue("test.echo", {})
        claim_then_expire(f"gone:{n}")
    real = services.requeue_expired
    monkeypatch.setattr(services, "requeue_expired", lambda **kw: real(**{**kw, "limit": 1}))
    assert tasks.reap() == {"requeued": 1, "failed": 0, "cancelled": 0, "more": 1}
    assert tasks.reap() == {"requeued": 1, "failed": 0, "cancelled": 0}


@override_settings(JOBSTATE={"REAP_INTERVAL_SECONDS": 60})
def test_the_pushers_reaper_sweeps_again_at_once_when_more_remain(broker, monkeypatch):
    # A sweep takes 500 jobs: after a mass loss the rest waited an interval per 500.
    for n in range(2):
        services.enqueue("test.echo", {})
        claim_then_expire(f"gone:{n}")
    real = services.requeue_expired
    monkeypatch.setattr(services, "requeue_expired", lambda **kw: real(**{**kw, "limit": 1}))
    reaped = JobEvent.objects.filter(transition="requeue", actor_label="system:reaper")
    broker._next_reap = 0
    broker.dequeue()
    assert reaped.count() == 1
    broker.dequeue()
    assert reaped.count() == 2


@override_settings(JOBSTATE={"REAP_INTERVAL_SECONDS": 60})
def test_the_pushers_reaper_logs_the_ids_of_the_jobs_it_moved(broker, caplog):
    # It logged "requeued 12, failed 0, cancelled 1 ..." and no job id to follow.
    for n in range(12):
        services.enqueue("test.echo", {})
        claim_then_expire(f"gone:{n}")
    services.enqueue("test.echo", {})
    (asked,) = services.claim("gone:asked")
    services.request_cancel(asked, "ops")
    Job.objects.filter(pk=asked.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    broker._next_reap = 0
    with caplog.at_level("WARNING", logger="jobstate.worker"):
        broker.dequeue()
    (message,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("jobstate reaper:")]
    requeued = JobEvent.objects.filter(transition="requeue", actor_label="system:reaper")
    ids = [str(pk) for pk in requeued.order_by("id").values_list("job_id", flat=True)]
    assert len(ids) == 12
    assert message == (
        "jobstate reaper: requeued 12, failed 0, cancelled 1 job(s) whose worker was lost "
        f"(requeued {', '.join(ids[:10])} and 2 more; cancelled {asked.pk})"
    )


@override_settings(JOBSTATE={"PREFETCH": 10})
def test_claims_follow_priority_and_never_start_early(broker):
    low = services.enqueue("test.echo", {}, priority=-5)
    later = services.enqueue("test.echo", {}, priority=9, run_after=timezone.now() + timedelta(hours=1))
    high = services.enqueue("test.echo", {}, priority=5)
    normal = services.enqueue("test.echo", {})
    handed = [ack.removeprefix("job:") for ack, _ in broker.dequeue()]
    assert handed == [str(high.pk), str(normal.pk), str(low.pk)]
    later.refresh_from_db()
    assert later.status == Status.QUEUED and later.attempts == 0


@override_settings(JOBSTATE={"WORKER_CHAIN_SECONDS": 0})  # the re-run goes through the pusher here
def test_keyed_job_raised_watermark_while_running_queues_a_rerun(broker):
    first = services.enqueue("test.echo", {"v": 1}, key="report:7", watermark=1)
    (package,) = unpack(broker.dequeue())
    # New input arrives while it runs: same key, same active job, watermark raised.
    assert services.enqueue("test.echo", {"v": 2}, key="report:7", watermark=2) == first
    assert run(package) == "completed"
    first.refresh_from_db()
    assert first.status == Status.COMPLETED and first.last_success_watermark == 1
    rerun = Job.objects.get(key="report:7", status=Status.QUEUED)
    assert rerun.input_watermark == 2
    counters.picked_up()
    (package,) = unpack(broker.dequeue())
    assert run(package) == "completed"
    # Input unchanged since: enqueue returns the finished job and nothing runs.
    assert services.enqueue("test.echo", {}, key="report:7", watermark=2).pk == rerun.pk
    assert not Job.objects.active().exists()


BAD_OPTIONS = [
    {"timeout": 0},
    {"timeout": -5},
    {"retry_backoff": -1},
    {"max_attempts": 0},
    {"concurrency": 0},
]


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_handler_options_are_checked_when_registered(options):
    with pytest.raises(ValueError):
        registry.handler("t.bad", **options)(lambda ctx: None)
    assert "t.bad" not in registry.all_handlers()


# -- only jobs still waiting in memory keep their lease -----------------------


def leases() -> dict[UUID, object]:
    return dict(Job.objects.values_list("pk", "lease_expires_at"))


@override_settings(JOBSTATE={"PREFETCH": 2, "LEASE_SECONDS": 60, "REAP_INTERVAL_SECONDS": 5})
def test_a_job_a_worker_took_then_died_with_is_left_to_the_reaper(broker):
    for _ in range(2):
        services.enqueue("test.echo", {})
    taken, waiting = (UUID(ack.removeprefix("job:")) for ack, _ in broker.dequeue())
    counters.picked_up()  # a worker took the first package and died before relabelling it
    soon = timezone.now() + timedelta(seconds=1)
    Job.objects.update(lease_expires_at=soon)
    broker._next_renew = 0
    broker.dequeue()
    assert leases()[waiting] > soon + timedelta(seconds=50)
    assert leases()[taken] == soon  # no longer renewed, although the cluster is busy
    Job.objects.filter(pk=taken).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    broker._next_reap = 0
    broker.dequeue()
    assert Job.objects.get(pk=taken).events.filter(transition="requeue", actor_label="system:reaper").exists()
    assert not Job.objects.get(pk=waiting).events.filter(transition="requeue").exists()


@override_settings(JOBSTATE={"PREFETCH": 2, "LEASE_SECONDS": 60})
def test_renewal_stops_once_no_worker_took_anything_for_longer_than_any_task_runs(broker):
    for _ in range(2):
        services.enqueue("test.echo", {})
    first, second = (UUID(ack.removeprefix("job:")) for ack, _ in broker.dequeue())
    start, limit = time.monotonic(), max_wait()
    soon = timezone.now() + timedelta(seconds=1)

    Job.objects.update(lease_expires_at=soon)
    broker._renew(start + limit - 10)  # a long wait behind long jobs: still renewed
    assert leases()[first] > soon and leases()[second] > soon

    counters.picked_up()  # a worker took the first: the queue moves
    broker._renew(start + limit - 5)
    Job.objects.update(lease_expires_at=soon)
    broker._renew(start + limit + 5)  # handed out long ago, but a pick-up was recent
    assert leases()[second] > soon and leases()[first] == soon

    broker._renew(start + 2 * limit)  # nothing taken for longer than any task may run
    Job.objects.update(lease_expires_at=soon)
    broker._renew(start + 2 * limit + 1)
    assert leases()[second] == soon


# -- django-q2's queue limit: the pusher never blocks on a full queue ---------


@override_settings(JOBSTATE={"PREFETCH": 10})
def test_never_hands_out_more_than_the_queue_limit(broker, monkeypatch):
    monkeypatch.setattr(Conf, "QUEUE_LIMIT", 3)
    for _ in range(5):
        services.enqueue("test.echo", {})
    assert broker.prefetch(now=100.0) == 3
    assert len(broker.dequeue()) == 3
    assert broker.dequeue() is None  # the queue is full: a put would block the pusher
    counters.picked_up()
    assert len(broker.dequeue()) == 1


def test_prefetch_respects_the_queue_limit(broker, monkeypatch):
    monkeypatch.setattr(Conf, "WORKERS", 8)
    monkeypatch.setattr(Conf, "QUEUE_LIMIT", 4)
    assert broker.prefetch(now=100.0) == 4


def test_plain_tasks_and_jobs_share_the_queue_limit(broker, monkeypatch):
    monkeypatch.setattr(Conf, "QUEUE_LIMIT", 2)
    for _ in range(2):
        async_task("jobstate.worker.tasks.reap", broker=broker)
    for _ in range(3):
        services.enqueue("test.echo", {})
    first = broker.dequeue()
    assert len(first) == 2 and not broker_module._is_job(first[0][0])  # one plain task, one job
    broker._next_plain = 0
    assert broker.dequeue() is None  # full
    pre_execute.send(sender="django_q", func=None, task=unpack(first)[0] | {"ack_id": first[0][0]})
    broker._next_plain = 0
    (second,) = broker.dequeue()
    assert not broker_module._is_job(second[0])  # the freed place went to the next plain task
    counters.picked_up()
    (third,) = broker.dequeue()
    assert broker_module._is_job(third[0])


@override_settings(JOBSTATE={"PREFETCH": 2, "LEASE_SECONDS": 60, "REAP_INTERVAL_SECONDS": 5})
def test_after_a_stall_waiting_jobs_are_renewed_before_the_reaper_runs(broker):
    job = services.enqueue("test.echo", {})
    broker.dequeue()
    # The pusher was held up past the lease with the job still waiting in memory.
    Job.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    broker._next_renew = broker._next_reap = 0
    broker.dequeue()
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.attempts == 0  # reserved: not charged yet
    assert job.lease_expires_at > timezone.now() + timedelta(seconds=50)
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim"]


# -- mixed versions: claim only kinds this process can run --------------------


def test_claims_only_kinds_registered_in_this_process(broker, temp_handler):
    temp_handler("t.newer")
    newer = services.enqueue("t.newer", {})
    registry.unregister("t.newer")  # this cluster runs a release without that handler
    mine = services.enqueue("test.echo", {})
    assert [ack for ack, _ in broker.dequeue()] == [f"job:{mine.pk}"]
    assert broker.dequeue() is None
    newer.refresh_from_db()
    assert newer.status == Status.QUEUED and newer.attempts == 0


# -- execute: errors before the handler starts, cancels on the hard limit -----


@pytest.mark.parametrize("cancelled", [False, True])
def test_execute_hands_back_a_job_it_could_not_start(broker, monkeypatch, cancelled):
    job = services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    if cancelled:
        services.request_cancel(job, "api", "stop")

    def broken(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "begin", broken)
    with pytest.raises(OperationalError):
        run(package)  # django-q2 records the failed package
    job.refresh_from_db()
    last = job.events.order_by("created_at", "id").last()
    assert last.actor_label == f"worker:{cluster_id()}:{os.getpid()}"
    if cancelled:
        assert job.status == Status.CANCELLED and last.transition == "cancel"
    else:
        # It never ran: no attempt charged.
        assert job.status == Status.QUEUED and job.attempts == 0 and last.transition == "requeue"
        assert job.error_type == "OperationalError" and "could not start" in job.error_message
    assert broker._still_waiting(time.monotonic()) == []


def test_hard_timeout_after_a_cancel_request_ends_cancelled(broker, temp_handler):
    def stuck(ctx):
        services.request_cancel(ctx.job.pk, "api", "stop")
        raise TimeoutException("Task exceeded maximum timeout value")

    temp_handler("t.stuck", stuck, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.stuck", {})
    (package,) = unpack(broker.dequeue())
    with pytest.raises(TimeoutException):
        run(package)
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.attempts == 1
    assert "HardTimeout" in job.events.get(transition="cancel").reason


def test_a_last_attempt_whose_start_fails_is_requeued_and_still_runs_once(broker, temp_handler):
    """The database fails as the worker process begins the job (its first write):
    the job goes back to the queue with the error, its only attempt unspent."""
    ran: list[int] = []
    temp_handler("t.once", lambda ctx: ran.append(ctx.attempt), max_attempts=1, retry_backoff=0)
    job = services.enqueue("t.once", {})
    (package,) = unpack(broker.dequeue())
    failed: list[str] = []

    def fail_first_job_update(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if not failed and sql.lstrip().upper().startswith("UPDATE") and "jobstate_job" in sql:
            failed.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_first_job_update), pytest.raises(OperationalError):
        run(package)
    job.refresh_from_db()
    assert failed and ran == []
    assert job.status == Status.QUEUED and job.attempts == 0 and job.error_type == "OperationalError"
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    counters.picked_up()
    (package,) = unpack(broker.dequeue())
    assert run(package) == "completed"
    job.refresh_from_db()
    assert ran == [1] and job.status == Status.COMPLETED and job.attempts == 1


@pytest.mark.parametrize("held", [False, True])
def test_a_package_without_a_lease_token_ends_no_job(temp_handler, held):
    """Every write after the claim carries its lease token: a package that names
    only a job id (a hand-made ``async_task(EXECUTE, job_id)``) neither runs nor
    ends the job, whether it waits in the queue or another worker runs it."""
    temp_handler("t.tokenless", lambda ctx: None)
    job = services.enqueue("t.tokenless", {})
    token = None
    if held:
        (claimed,) = services.claim("host:1")
        services.begin(claimed, claimed.lease_token, "host:1:2")
        token = claimed.lease_token
    assert tasks.execute(str(job.pk)) == "skipped"
    job.refresh_from_db()
    assert (job.status, job.lease_token) == ((Status.PROCESSING, token) if held else (Status.QUEUED, None))
    assert job.error_type == ""
