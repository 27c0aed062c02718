"""The core's extension points: called inside the transaction that changed the job."""

from __future__ import annotations

import logging

import pytest

from jobstate import hooks, services
from jobstate.models import Job, JobEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def seen():
    calls: list[hooks.Transition] = []
    hooks.transitioned.register(calls.append)
    yield calls
    hooks.transitioned.unregister(calls.append)


def test_transitioned_sees_enqueue_claim_and_outcome(seen):
    job = services.enqueue("test.echo", {"a": 1})
    (claimed,) = services.claim("w1", limit=1)
    services.complete(claimed, claimed.lease_token, {"ok": True})
    assert [(c.job_id, c.from_status, c.to_status, c.transition) for c in seen] == [
        (job.pk, "", "queued", "enqueue"),
        (job.pk, "queued", "processing", "claim"),
        (job.pk, "processing", "completed", "complete"),
    ]
    assert seen[1].actor_label.startswith("worker") and seen[1].at is not None


def test_a_failing_hook_rolls_the_transition_back():
    job = services.enqueue("test.echo", {})

    def refuse(change: hooks.Transition) -> None:
        raise RuntimeError("no")

    hooks.transitioned.register(refuse)
    try:
        with pytest.raises(RuntimeError):
            services.request_cancel(job, reason="x")
    finally:
        hooks.transitioned.unregister(refuse)
    job.refresh_from_db()
    assert job.status == "queued" and job.cancel_requested_at is None
    assert JobEvent.objects.filter(job=job).count() == 1


def test_register_is_idempotent_and_empty_hook_is_falsy():
    hook: hooks.Hook[[int]] = hooks.Hook("demo")
    calls: list[int] = []
    assert not hook
    hook.register(calls.append)
    hook.register(calls.append)
    hook(3)
    assert calls == [3] and bool(hook)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("hook_name", ["attempt_started", "attempt_ended"])
def test_a_raising_attempt_observer_changes_nothing(hook_name, caplog):
    from jobstate.worker.runner import drain
    from jobstate.worker.supervisor import supervisor

    def broken(*args: object) -> None:
        raise RuntimeError("exporter down")

    hook = getattr(hooks, hook_name)
    hook.register(broken)
    # Listen on jobstate's logger itself: whether its records reach the root logger
    # (where caplog listens) depends on the logging set-up earlier tests left behind.
    logging.getLogger("jobstate").addHandler(caplog.handler)
    try:
        job = services.enqueue("test.echo", {"value": 1})
        assert drain("host:1:2", kinds=["test.echo"]) == 1
    finally:
        hook.unregister(broken)
        logging.getLogger("jobstate").removeHandler(caplog.handler)
    done = Job.objects.get(pk=job.pk)
    assert done.status == "completed" and done.attempts == 1
    assert supervisor().slot is None  # the attempt's slot was closed: no heartbeat for it
    assert f"the {hook_name} hook raised" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_job_transitioned_is_sent_after_commit_and_a_raising_receiver_reaches_no_caller(caplog):
    """A receiver runs after the commit; one that raised was raised into the caller: a
    worker then took its stored outcome for a failed write (and reported the attempt lost),
    and the receivers after it were not called."""
    from jobstate.signals import job_transitioned
    from jobstate.worker.runner import run_next

    sent: list[tuple[str, str, str]] = []

    def broken(**kwargs: object) -> None:
        raise RuntimeError("receiver bug")

    def record(job_id: object, from_status: str, to_status: str, transition: str, **kwargs: object) -> None:
        sent.append((from_status, to_status, transition))

    job_transitioned.connect(broken, sender=Job, dispatch_uid="test-broken")
    job_transitioned.connect(record, sender=Job, dispatch_uid="test-record")
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            job = services.enqueue("test.echo", {"a": 1})
            ran = run_next("w1", kinds=["test.echo"])
    finally:
        job_transitioned.disconnect(dispatch_uid="test-broken", sender=Job)
        job_transitioned.disconnect(dispatch_uid="test-record", sender=Job)
    assert ran is not None and ran.pk == job.pk
    job.refresh_from_db()
    assert job.status == "completed"
    assert sent == [
        ("", "queued", "enqueue"),
        ("queued", "processing", "claim"),
        ("processing", "completed", "complete"),
    ]
    assert any(
        "receiver bug" in r.getMessage() or (r.exc_info and "receiver bug" in str(r.exc_info[1]))
        for r in caplog.records
    )
