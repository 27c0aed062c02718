"""The edges of an inline run stopped by Ctrl-C (``KeyboardInterrupt``): the claim,
and an outcome write that committed before the interrupt."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobstate import Partial, hooks, services
from jobstate.exceptions import CancelRequested, Suspend
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import endings
from jobstate.worker.runner import drain, run_next

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def pythons_ctrl_c_handler() -> Iterator[None]:
    """Python's own SIGINT handler, as a run in a terminal has. A test run started in
    the background (nohup, a CI job) inherits SIGINT ignored, which Python keeps, and
    ``ctrl_c_held`` then rightly holds nothing: there is no Ctrl-C to hold."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def ended() -> Iterator[list[str]]:
    """The outcomes the ``attempt_ended`` hook was told."""
    outcomes: list[str] = []

    def record(ctx: Any, outcome: str) -> None:
        outcomes.append(outcome)

    hooks.attempt_ended.register(record)
    yield outcomes
    hooks.attempt_ended.unregister(record)


def _raises(error: BaseException) -> Callable[[Any], Any]:
    def handler(ctx: Any) -> Any:
        raise error

    return handler


def _cancelled(ctx: Any) -> Any:
    services.request_cancel(ctx.job.pk, "api", "stop")
    raise CancelRequested(ctx.job.pk)


def _claim_then_ctrl_c(monkeypatch: pytest.MonkeyPatch, presses: int, before: bool = False) -> None:
    """Ctrl-C pressed ``presses`` times in the claim, after its commit (or ``before`` it)."""
    real = services.claim

    def claim(*args: Any, **kwargs: Any) -> list[Job]:
        claimed = [] if before else real(*args, **kwargs)
        for _ in range(presses):
            signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt
        return real(*args, **kwargs) if before else claimed

    monkeypatch.setattr(services, "claim", claim)


def test_ctrl_c_in_the_claim_of_run_next_hands_the_claimed_job_back(temp_handler, monkeypatch):
    # It was raised inside the claim, after its commit: the job stayed processing under a
    # lease token nobody knew, until the reaper took it once the lease expired.
    temp_handler("t.claim_ctrl_c", lambda ctx: {"done": True}, max_attempts=1)
    job = services.enqueue("t.claim_ctrl_c", {})
    handler = signal.getsignal(signal.SIGINT)
    _claim_then_ctrl_c(monkeypatch, presses=1)
    with pytest.raises(KeyboardInterrupt):
        run_next("inline")
    assert signal.getsignal(signal.SIGINT) is handler
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id, job.lease_token) == (Status.QUEUED, 0, "", None)
    requeue = job.events.order_by("id").last()
    assert requeue.transition == "requeue" and requeue.metadata.get("handed_back") is True
    monkeypatch.undo()
    assert run_next("inline") is not None
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 1)


def test_a_second_ctrl_c_in_the_claim_lands_at_once(temp_handler, monkeypatch):
    # The operator insists (a claim stuck on a lock): the claim is cut short, nothing claimed.
    temp_handler("t.claim_ctrl_c_twice", lambda ctx: {"done": True})
    job = services.enqueue("t.claim_ctrl_c_twice", {})
    handler = signal.getsignal(signal.SIGINT)
    _claim_then_ctrl_c(monkeypatch, presses=2, before=True)
    with pytest.raises(KeyboardInterrupt):
        run_next("inline")
    assert signal.getsignal(signal.SIGINT) is handler
    job.refresh_from_db()
    assert (job.status, job.attempts, list(job.events.values_list("transition", flat=True))) == (
        Status.QUEUED,
        0,
        ["enqueue"],
    )


LATER = timezone.now() + timedelta(days=1)

# (module, function the outcome write calls, handler, max_attempts, outcome stored, status)
WRITES = [
    (services, "complete", lambda ctx: {"done": True}, 1, "completed", Status.COMPLETED),
    (services, "mark_partial", _raises(Partial("half", {"rows": 1})), 1, "partial", Status.PARTIAL),
    (endings, "end_attempt", _raises(ValueError("bad")), 2, "retrying", Status.QUEUED),
    (endings, "end_attempt", _raises(ValueError("bad")), 1, "failed", Status.FAILED),
    (services, "suspend", _raises(Suspend("later", until=LATER)), 1, "suspended", Status.QUEUED),
    (services, "suspend", _raises(Suspend("children")), 1, "suspended", Status.QUEUED),  # none: woken
    (services, "cancel_now", _cancelled, 1, "cancelled", Status.CANCELLED),
]


@pytest.mark.parametrize(("module", "call", "handler", "attempts", "outcome", "status"), WRITES)
def test_ctrl_c_after_the_outcome_was_committed_reports_that_outcome(
    temp_handler, monkeypatch, ended, module, call, handler, attempts, outcome, status
):
    # The hand-back, refused (the job had left processing), made attempt_ended say "lost":
    # a trace or metric showed a lost attempt whose outcome was stored.
    temp_handler("t.late_ctrl_c", handler, max_attempts=attempts)
    job = services.enqueue("t.late_ctrl_c", {})
    real = getattr(module, call)

    def stored_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, call, stored_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        drain()
    assert Job.objects.get(pk=job.pk).status == status
    assert ended == [outcome]


def test_ctrl_c_in_an_outcome_write_that_did_not_commit_hands_the_job_back(temp_handler, monkeypatch, ended):
    temp_handler("t.early_ctrl_c", lambda ctx: {"done": True})
    job = services.enqueue("t.early_ctrl_c", {})

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(services, "complete", interrupted)
    with pytest.raises(KeyboardInterrupt):
        drain()
    assert (Job.objects.get(pk=job.pk).status, ended) == (Status.QUEUED, ["interrupted"])


def test_an_outcome_stored_by_someone_else_is_still_lost(temp_handler, monkeypatch, ended):
    # The lease was lost, then Ctrl-C: the job's history has no outcome of this attempt.
    temp_handler("t.taken_ctrl_c", lambda ctx: {"done": True})
    job = services.enqueue("t.taken_ctrl_c", {})

    def taken_then_interrupted(held: Job, *args: Any, **kwargs: Any) -> Any:
        services.force_fail(held.pk, actor="ops", reason="taken")
        raise KeyboardInterrupt

    monkeypatch.setattr(services, "complete", taken_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        drain()
    assert (Job.objects.get(pk=job.pk).status, ended) == (Status.FAILED, ["lost"])


def test_a_second_ctrl_c_in_a_nested_hold_lands_at_once():
    # The inner hold passed its second press to the outer one, which held it in turn:
    # the operator's insisting Ctrl-C waited for the outer block to end.
    from jobstate.worker.ctrl_c import ctrl_c_held

    handler = signal.getsignal(signal.SIGINT)
    after: list[str] = []
    with pytest.raises(KeyboardInterrupt), ctrl_c_held():
        with ctrl_c_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            after.append("inner")
        after.append("outer")
    assert after == [] and signal.getsignal(signal.SIGINT) is handler


def test_one_ctrl_c_in_a_nested_hold_lands_once_the_outer_block_ends():
    from jobstate.worker.ctrl_c import ctrl_c_held

    handler = signal.getsignal(signal.SIGINT)
    after: list[str] = []
    with pytest.raises(KeyboardInterrupt), ctrl_c_held():
        with ctrl_c_held():
            signal.raise_signal(signal.SIGINT)
        after.append("outer")
    assert after == ["outer"] and signal.getsignal(signal.SIGINT) is handler
