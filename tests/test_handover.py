"""A worker's hand-over (``services.handover``): the outcome of its job and the
claim of its next one in one statement on PostgreSQL, refused together, and
never where something else belongs in either transaction."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobstate import hooks, services
from jobstate.exceptions import LeaseLost
from jobstate.models import Job
from jobstate.states import Status

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_webhook_wants_an_event():  # type: ignore[no-untyped-def]
    # The webhooks' hook says it may write whenever its cached answer ("which events does
    # an endpoint want?") is older than WEBHOOK_CACHE_SECONDS (2 s), and a move that may
    # write keeps its transaction: a count of one statement would fail if more than 2 s
    # passed between a test's last enqueue (which refreshed it) and its outcome.
    from jobstate.webhooks import cache

    cache.put(frozenset(), 3600)
    yield
    cache.forget()


ME = "host:1:2"
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement on PostgreSQL")


def _running(**options):  # type: ignore[no-untyped-def]
    job = services.enqueue("test.echo", {"n": 0}, **options)
    (claimed,) = services.claim(ME, kinds=["test.echo"], start=True)
    assert claimed.pk == job.pk
    return claimed


def _transitions(job: Job) -> list[tuple[str, str]]:
    return list(job.events.order_by("id").values_list("transition", "actor_label"))


@postgres_only
def test_the_outcome_and_the_next_claim_are_one_statement():
    done = _running()
    following = services.enqueue("test.echo", {"n": 1})
    then = services.NextClaim(ME, ["test.echo"])
    with CaptureQueriesContext(connection) as queries:
        services.complete(done, done.lease_token, {"ok": 1}, then=then)
    assert len(queries) == 1, [q["sql"][:300] for q in queries.captured_queries]
    assert then.tried and [j.pk for j in then.claimed] == [following.pk]
    taken = then.claimed[0]
    assert taken.status == Status.PROCESSING and taken.lease_token is not None
    # Begun in the same statement: as claim(start=True).
    assert taken.attempts == 1 and taken.started_at is not None and taken.worker_id == ME
    row = Job.objects.get(pk=done.pk)
    assert row.status == Status.COMPLETED and row.result == {"ok": 1} and row.lease_token is None
    assert _transitions(row)[-1] == ("complete", f"worker:{ME}")
    assert _transitions(Job.objects.get(pk=following.pk)) == [
        ("enqueue", "system"),
        ("claim", f"worker:{ME}"),
    ]
    assert Job.objects.get(pk=following.pk).events.get(transition="claim").metadata == {"attempt": 1}


@postgres_only
def test_nothing_ready_is_a_claim_tried_and_empty():
    done = _running()
    then = services.NextClaim(ME, ["test.echo"])
    services.complete(done, done.lease_token, None, then=then)
    assert then.tried and then.claimed == []
    assert Job.objects.get(pk=done.pk).status == Status.COMPLETED


@postgres_only
def test_a_refused_outcome_claims_nothing():
    import uuid

    done = _running()
    following = services.enqueue("test.echo", {"n": 1})
    then = services.NextClaim(ME, ["test.echo"])
    with pytest.raises(LeaseLost):
        services.complete(done, uuid.uuid4(), None, then=then)
    assert then.claimed == []
    assert Job.objects.get(pk=done.pk).status == Status.PROCESSING
    assert Job.objects.get(pk=following.pk).status == Status.QUEUED


@postgres_only
def test_only_the_kinds_asked_for_and_no_job_with_a_cancel_request():
    from django.utils import timezone

    done = _running()
    services.enqueue("test.schema", {"width": 3})
    asked = services.enqueue("test.echo", {"n": 1})
    Job.objects.filter(pk=asked.pk).update(cancel_requested_at=timezone.now())
    then = services.NextClaim(ME, ["test.echo"])
    services.complete(done, done.lease_token, None, then=then)
    assert then.tried and then.claimed == []  # left to begin(), which cancels it unstarted


BOTH = ["test.echo", "test.limited"]  # test.limited: at most 2 processing


@postgres_only
def test_a_next_job_without_a_limit_is_claimed_with_the_outcome_though_a_limited_kind_is_asked_for():
    done = _running()
    behind = services.enqueue("test.limited", {}, priority=-1)
    following = services.enqueue("test.echo", {"n": 1})
    then = services.NextClaim(ME, BOTH)
    with CaptureQueriesContext(connection) as queries:
        services.complete(done, done.lease_token, None, then=then)
    assert len(queries) == 1, [q["sql"][:300] for q in queries.captured_queries]
    assert then.tried and [j.pk for j in then.claimed] == [following.pk]
    assert Job.objects.get(pk=following.pk).status == Status.PROCESSING
    assert Job.objects.get(pk=behind.pk).status == Status.QUEUED


@postgres_only
@pytest.mark.parametrize("full", [False, True])
def test_a_next_job_of_a_limited_kind_is_left_to_the_claim_that_counts_its_limit(full):
    """The next ready job is of a limited kind: the hand-over takes nothing (not
    the job of another kind behind it either: claim order), and the worker's own
    claim takes it if the limit leaves room, else the one behind it."""
    done = _running()
    if full:
        services.enqueue("test.limited", {})
        services.enqueue("test.limited", {})
        assert len(services.claim("other:1:2", kinds=["test.limited"], limit=2, start=True)) == 2
    first = services.enqueue("test.limited", {}, priority=5)
    behind = services.enqueue("test.echo", {"n": 1})
    then = services.NextClaim(ME, BOTH)
    services.complete(done, done.lease_token, None, then=then)
    assert not then.tried and then.claimed == []
    assert Job.objects.get(pk=done.pk).status == Status.COMPLETED
    assert Job.objects.filter(pk__in=[first.pk, behind.pk], status=Status.QUEUED).count() == 2
    (taken,) = services.claim(ME, kinds=BOTH, start=True)
    assert taken.pk == (behind.pk if full else first.pk)
    assert Job.objects.filter(kind="test.limited", status=Status.PROCESSING).count() == (2 if full else 1)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_limited_job_picked_and_left_is_free_once_the_outcome_committed():
    """The hand-over locks the job it picks (``FOR UPDATE SKIP LOCKED``); one it
    leaves is released at the commit: another worker's claim takes it at once."""
    import threading

    from django.db import connections

    done = _running()
    left = services.enqueue("test.limited", {})
    then = services.NextClaim(ME, BOTH)
    services.complete(done, done.lease_token, None, then=then)
    assert not then.tried
    taken: list[list[Job]] = []

    def other_worker() -> None:
        try:
            taken.append(services.claim("other:1:2", kinds=["test.limited"]))
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_worker)
    thread.start()
    thread.join()
    assert [[job.pk for job in jobs] for jobs in taken] == [[left.pk]]


def _left_to_the_worker(done: Job, following: Job) -> None:
    then = services.NextClaim(ME, ["test.echo", "test.limited"])
    services.complete(done, done.lease_token, None, then=then)
    assert not then.tried and then.claimed == []
    assert Job.objects.get(pk=done.pk).status == Status.COMPLETED
    assert Job.objects.get(pk=following.pk).status == Status.QUEUED


def test_a_keyed_job_completes_on_its_own_for_its_rerun_check():
    done = _running(key="k1")
    _left_to_the_worker(done, services.enqueue("test.echo", {"n": 1}))


def test_a_kind_with_a_concurrency_limit_is_counted_by_a_claim_of_its_own():
    done = _running()
    _left_to_the_worker(done, services.enqueue("test.limited", {}))


def test_a_hook_that_writes_keeps_its_transaction():
    seen: list[hooks.Transition] = []
    hooks.transitioned.register(seen.append)  # no ``writes``: it may write
    try:
        done = _running()
        _left_to_the_worker(done, services.enqueue("test.echo", {"n": 1}))
    finally:
        hooks.transitioned.unregister(seen.append)
    assert [c.transition for c in seen][-1] == "complete"


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_hooks_that_only_read_observe_both_changes_after_the_commit():
    seen: list[tuple[str, bool]] = []

    def observe(change: hooks.Transition) -> None:
        seen.append((change.transition, connection.in_atomic_block))

    hooks.transitioned.register(observe, writes=lambda change: False)
    try:
        done = _running()
        services.enqueue("test.echo", {"n": 1})
        then = services.NextClaim(ME, ["test.echo"])
        services.complete(done, done.lease_token, None, then=then)
    finally:
        hooks.transitioned.unregister(observe)
    assert seen[-2:] == [("complete", False), ("claim", False)] and len(then.claimed) == 1


@pytest.mark.skipif(connection.vendor == "postgresql", reason="SQLite: two statements")
def test_sqlite_completes_and_claims_nothing():
    done = _running()
    _left_to_the_worker(done, services.enqueue("test.echo", {"n": 1}))
