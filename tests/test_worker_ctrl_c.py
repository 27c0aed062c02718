"""The edges of an inline run stopped by Ctrl-C (``KeyboardInterrupt``): the claim,
and an outcome write that committed before the interrupt."""

from __future__ import annotations

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
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db(transaction=True)


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
