"""A worker process that ends a job claims and begins its next one itself (``tasks.chain``)."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection
from django.test import override_settings

from jobstate import registry, services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import counters, tasks
from jobstate.worker.cluster import cluster_id
from jobstate.worker.packages import CHAIN_MARGIN
from jobstate.worker.runner import hard_limit_for
from tests.test_worker_broker import run, unpack

pytestmark = pytest.mark.django_db(transaction=True)


def me() -> str:
    return f"{cluster_id()}:{os.getpid()}"


def test_after_its_job_a_worker_runs_the_ready_ones_itself_each_claimed_and_begun_at_once(broker):
    first = services.enqueue("test.echo", {"n": 0})
    (package,) = unpack(broker.dequeue())
    rest = [services.enqueue("test.echo", {"n": i}) for i in (1, 2, 3)]
    assert run(package) == "completed"
    for job in rest:
        done = Job.objects.get(pk=job.pk)
        assert done.status == Status.COMPLETED and done.attempts == 1 and done.worker_id == me()
        assert list(done.events.order_by("id").values_list("transition", flat=True)) == [
            "enqueue",
            "claim",
            "complete",
        ]
        claim = done.events.get(transition="claim")
        # Claimed by the worker process itself, begun in the same statement: attempt 1.
        assert claim.actor_label == f"worker:{me()}" and claim.metadata == {"attempt": 1}
    assert Job.objects.get(pk=first.pk).events.get(transition="claim").actor_label == f"worker:{cluster_id()}"
    assert counters.busy is not None and counters.busy.count() == 0  # left its slot on return


def test_the_chain_stops_while_a_package_waits_in_the_queue(broker):
    services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    behind = services.enqueue("test.echo", {})
    assert counters.pending is not None
    counters.pending.add(1)  # another package waits: reserved work goes first
    run(package)
    assert Job.objects.get(pk=behind.pk).status == Status.QUEUED


@override_settings(JOBSTATE={"WORKER_CHAIN_SECONDS": 0})
def test_a_chain_of_zero_seconds_returns_to_django_q2_after_each_job(broker):
    services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    behind = services.enqueue("test.echo", {})
    run(package)
    assert Job.objects.get(pk=behind.pk).status == Status.QUEUED


def test_only_kinds_whose_hard_limit_fits_what_is_left_of_django_q2s_are_taken(broker):
    job = services.enqueue("test.echo", {})
    limit = hard_limit_for(registry.get_handler("test.echo"))
    now = time.monotonic()
    # django-q2 would kill this process before an echo job's own hard limit: not taken.
    assert tasks.chain(me(), hard_deadline=now + limit, started=now) == 0
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert tasks.chain(me(), hard_deadline=now + limit + 2 * CHAIN_MARGIN, started=now) == 1
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED


def test_chained_claims_respect_concurrency_limits(broker, temp_handler):
    temp_handler("test.one_at_a_time", lambda ctx: "ok", concurrency=1)
    held = services.enqueue("test.one_at_a_time", {})
    (running,) = services.claim("other:1:2", kinds=["test.one_at_a_time"], start=True)
    waiting = services.enqueue("test.one_at_a_time", {})
    now = time.monotonic()
    assert tasks.chain(me(), hard_deadline=now + 10_000, started=now) == 0
    assert Job.objects.get(pk=waiting.pk).status == Status.QUEUED
    assert running.pk == held.pk


def test_with_limited_kinds_registered_the_next_job_is_claimed_with_the_outcome(broker, monkeypatch):
    """test.limited has a concurrency limit: on PostgreSQL the echo jobs still
    hand over, each claimed by the completion of the one before."""
    first = services.enqueue("test.echo", {"n": 0})
    (package,) = unpack(broker.dequeue())
    rest = [services.enqueue("test.echo", {"n": i}) for i in (1, 2)]
    claims: list[object] = []
    real = services.claim

    def counted(*args: object, **kwargs: object) -> object:
        claims.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(services, "claim", counted)
    assert run(package) == "completed"
    assert Job.objects.filter(pk__in=[first.pk, *(j.pk for j in rest)], status=Status.COMPLETED).count() == 3
    # SQLite: a claim of its own for each next job, and one that finds none.
    assert len(claims) == (0 if connection.vendor == "postgresql" else 3)


def test_a_chained_worker_keeps_a_full_kinds_limit_and_the_claim_order(broker, temp_handler):
    temp_handler("test.one_at_a_time", lambda ctx: "ok", concurrency=1)
    services.enqueue("test.echo", {"n": 0})
    (package,) = unpack(broker.dequeue())
    services.enqueue("test.one_at_a_time", {})
    services.claim("other:1:2", kinds=["test.one_at_a_time"], start=True)
    waiting = services.enqueue("test.one_at_a_time", {}, priority=5)
    behind = services.enqueue("test.echo", {"n": 1})
    assert run(package) == "completed"
    assert Job.objects.get(pk=waiting.pk).status == Status.QUEUED
    assert Job.objects.get(pk=behind.pk).status == Status.COMPLETED


def test_a_queued_job_with_a_cancel_request_is_left_to_begin(broker):
    from django.utils import timezone

    job = services.enqueue("test.echo", {})
    # A job that suspended after a cancel request came back queued, still asked to cancel.
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    assert services.claim(me(), kinds=["test.echo"], start=True) == []
    (reserved,) = services.claim(cluster_id(), kinds=["test.echo"])  # the pusher's claim
    assert reserved.pk == job.pk and reserved.started_at is None


def test_each_chained_job_gets_its_own_django_q2_hard_limit(broker, temp_handler, monkeypatch):
    temp_handler("test.quick", lambda ctx: "ok", timeout=5)
    armed: list[float] = []
    monkeypatch.setattr(tasks.q2, "rearm_hard_limit", armed.append)
    services.enqueue("test.quick", {})
    now = time.monotonic()
    assert tasks.chain(me(), hard_deadline=now + 10_000, started=now) == 1
    assert armed == [hard_limit_for(registry.get_handler("test.quick"))]


def test_rearming_the_hard_limit_needs_django_q2s_alarm_handler():
    import signal

    from jobstate.worker import q2

    previous = signal.getsignal(signal.SIGALRM)
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        assert q2.rearm_hard_limit(5) is False and signal.alarm(0) == 0
        signal.signal(signal.SIGALRM, lambda *_: None)  # as django-q2's TimeoutHandler installs
        assert q2.rearm_hard_limit(5) is True
        assert 4 <= signal.alarm(0) <= 5
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_closed_connection_at_the_next_claim_ends_the_chain_not_the_task(
    broker, temp_handler, monkeypatch, caplog
):
    """The claim of the next job fails with an InterfaceError (psycopg2's
    "connection already closed"), which is no DatabaseError: it went up to
    django-q2 after the first job's outcome was stored, and django-q2 recorded a
    failed task. The chain ends there, as for any database error."""
    from django.db import InterfaceError

    from jobstate.services import handover

    # No hand-over: the worker claims its next job itself.
    monkeypatch.setattr(handover, "possible", lambda *args: False)
    first = services.enqueue("test.echo", {})
    (package,) = unpack(broker.dequeue())
    behind = services.enqueue("test.echo", {})
    claims: list[object] = []

    def closed(*args: object, **kwargs: object) -> None:
        claims.append(kwargs)
        raise InterfaceError("connection already closed")

    monkeypatch.setattr(services, "claim", closed)
    assert run(package) == "completed"
    assert claims and "could not claim a next job; back to django-q2" in caplog.text
    assert Job.objects.get(pk=first.pk).status == Status.COMPLETED
    assert Job.objects.get(pk=behind.pk).status == Status.QUEUED
