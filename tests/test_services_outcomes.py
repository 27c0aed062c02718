"""complete(): the watermark a run saw is the one at claim time, and the re-run
it may queue never undoes the completion."""

from __future__ import annotations

import logging

import pytest
from rest_framework import serializers

from jobstate import services
from jobstate.exceptions import LeaseLost
from jobstate.models import Job
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def raised_while_running(kind: str = "test.echo") -> Job:
    """A keyed job claimed at watermark 1 whose input moved to 2 while it ran."""
    services.enqueue(kind, {"width": 3}, key="k", watermark=1)
    (claimed,) = services.claim("w")
    services.enqueue(kind, {"width": 3}, key="k", watermark=2)
    return claimed


@pytest.mark.parametrize("ref", ["id", "reloaded job"])
def test_complete_uses_the_watermark_seen_at_claim(ref):
    claimed = raised_while_running()
    job = claimed.pk if ref == "id" else Job.objects.get(pk=claimed.pk)
    services.complete(job, claimed.lease_token)
    done = Job.objects.get(pk=claimed.pk)
    assert done.status == Status.COMPLETED and done.last_success_watermark == 1
    rerun = Job.objects.get(key="k", status=Status.QUEUED)
    assert rerun.input_watermark == 2 and rerun.pk != done.pk
    assert rerun.events.get().actor_label == "system:watermark"


def test_start_claims_at_the_stored_watermark_not_the_callers_copy():
    job = services.enqueue("test.echo", {}, key="k", watermark=1)
    services.enqueue("test.echo", {}, key="k", watermark=2)  # job (in memory) still says 1
    started = services.start(job, "w")
    assert started.claimed_watermark == 2
    services.complete(started, started.lease_token)
    assert Job.objects.get(pk=job.pk).last_success_watermark == 2
    assert not Job.objects.filter(status=Status.QUEUED).exists()  # nothing was dirty


def test_completion_records_claimed_watermark_on_the_instance():
    claimed = raised_while_running()
    services.complete(claimed, claimed.lease_token)
    assert claimed.last_success_watermark == 1 and claimed.status == Status.COMPLETED


class Strict(serializers.Serializer):
    width = serializers.IntegerField(min_value=100)


def test_rerun_keeps_the_stored_parameters_when_the_schema_changed(temp_handler):
    temp_handler("tmp.report")
    claimed = raised_while_running("tmp.report")
    temp_handler("tmp.report", schema=Strict)  # width=3 would now be refused
    services.complete(claimed.pk, claimed.lease_token, {"ok": 1})
    assert Job.objects.get(pk=claimed.pk).status == Status.COMPLETED
    rerun = Job.objects.get(key="k", status=Status.QUEUED)
    assert rerun.parameters == {"width": 3} and rerun.input_watermark == 2


def test_unregistered_kind_completes_without_a_rerun(temp_handler, caplog):
    temp_handler("tmp.gone")
    claimed = raised_while_running("tmp.gone")
    from jobstate import registry

    registry.unregister("tmp.gone")
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        services.complete(claimed, claimed.lease_token, {"ok": 1})
    assert Job.objects.get(pk=claimed.pk).status == Status.COMPLETED
    assert not Job.objects.filter(status=Status.QUEUED).exists()
    assert any("tmp.gone" in r.getMessage() and "re-run" in r.getMessage() for r in caplog.records)


def test_outcome_calls_are_still_exported():
    from jobstate.services import outcomes

    assert services.complete is outcomes.complete
    assert services.fail is outcomes.fail
    assert services.fail_held is outcomes.fail_held
    assert services.mark_partial is outcomes.mark_partial


def test_the_history_keeps_the_exception_line_of_a_traceback_with_a_long_message():
    from jobstate.services.outcomes import _clipped_traceback

    frames = "Traceback (most recent call last):\n" + '  File "a.py", line 1, in f\n    g()\n' * 50
    long_frames = frames * 10 + "app.errors.Declined: no\n"
    assert _clipped_traceback(long_frames, "Declined") == long_frames[-8000:]  # as before
    long_message = frames + "app.errors.Declined: " + "x" * 9000 + "\n"
    kept = _clipped_traceback(long_message, "Declined")
    assert len(kept) <= 8000 and "\napp.errors.Declined: xxx" in kept and kept.startswith(frames[-4000:])


def cancel_requested_while_running(max_attempts: int = 3) -> Job:
    """A started job (attempt 1 of ``max_attempts``) whose cancel was requested."""
    job = services.enqueue("test.echo", {}, max_attempts=max_attempts)
    started = services.start(job, "w")
    services.request_cancel(job, "api", "not needed")
    return started


@pytest.mark.parametrize("retry", [True, False])
def test_fail_after_a_cancel_request_ends_the_job_cancelled_not_requeued(retry):
    started = cancel_requested_while_running()
    moved = services.fail(
        started, started.lease_token, "boom", error_type="KeyError", retry=retry, progress={"progress": 40}
    )
    job = Job.objects.get(pk=started.pk)
    assert moved is started and started.status == job.status == Status.CANCELLED
    assert job.progress == 40 and job.attempts == 1 and job.lease_token is None
    event = job.events.order_by("id").last()
    assert (event.from_status, event.to_status, event.transition) == (
        Status.PROCESSING,
        Status.CANCELLED,
        "cancel",
    )
    assert event.reason == "cancel requested; the attempt ended with KeyError: boom"
    assert event.metadata["requested_at"] == job.cancel_requested_at.isoformat()


def test_fail_of_the_last_attempt_after_a_cancel_request_ends_it_cancelled():
    started = cancel_requested_while_running(max_attempts=1)
    services.fail(started.pk, started.lease_token, "boom")
    job = Job.objects.get(pk=started.pk)
    assert job.status == Status.CANCELLED and job.error_message == ""
    assert job.events.order_by("id").last().reason == "cancel requested; the attempt ended with boom"


# -- a worker's outcome without a lease token --------------------------------------

HELD_CALLS = {
    "complete": lambda job: services.complete(job, None, {"late": True}),
    "mark_partial": lambda job: services.mark_partial(job, None, {"late": True}, "half"),
    "fail_held": lambda job: services.fail_held(job, None, "late", retry=False),
    "cancel_now": lambda job: services.cancel_now(job, None),
    "suspend": lambda job: services.suspend(job, None),
    "hand_back": lambda job: services.hand_back(job, None, reason="late"),
}


@pytest.mark.parametrize("call", HELD_CALLS.values(), ids=HELD_CALLS.keys())
@pytest.mark.parametrize("state", ["processing", "requeued"])
def test_a_worker_outcome_without_a_lease_token_is_refused_and_writes_nothing(call, state):
    """None was read as "no lease check": a stale worker whose copy of the job had
    its token cleared (by its own outcome, stored) ended the job, requeued or still
    running under another holder's lease, as it pleased."""
    job = services.enqueue("test.echo", {}, max_attempts=3)
    started = services.start(job, "w")
    if state == "requeued":
        services.fail(started.pk, started.lease_token, "flaky", retry_delay=0)
    before = Job.objects.get(pk=job.pk)
    events = job.events.count()
    stale = Job.objects.get(pk=job.pk)
    stale.lease_token = None
    with pytest.raises(LeaseLost):
        call(stale)
    after = Job.objects.get(pk=job.pk)
    assert (after.status, after.lease_token, after.result, after.attempts, after.updated_at) == (
        before.status,
        before.lease_token,
        before.result,
        before.attempts,
        before.updated_at,
    )
    assert job.events.count() == events


def test_a_worker_ending_an_attempt_without_a_lease_token_is_refused():
    from jobstate.worker.endings import end_attempt

    job = services.enqueue("test.echo", {}, max_attempts=3)
    started = services.start(job, "w")
    services.fail(started.pk, started.lease_token, "flaky", retry_delay=0)  # requeued
    with pytest.raises(LeaseLost):
        end_attempt(started, None, "Stopped by the worker's hard time limit", error_type="HardTimeout")
    after = Job.objects.get(pk=job.pk)
    assert after.status == Status.QUEUED and after.error_message == "flaky"


def test_fail_without_a_lease_token_is_the_unleased_form():
    """Kept (public, documented): an operator's or a script's fail, no lease checked."""
    job = services.enqueue("test.echo", {})
    services.fail(job.pk, None, "given up", retry=False)
    assert Job.objects.get(pk=job.pk).status == Status.FAILED
