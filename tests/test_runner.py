"""The runner in-process: outcomes, retries, cancellation, timeouts."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from jobstate import NonRetryable, Partial, services
from jobstate.exceptions import CancelRequested
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_completed_with_progress_and_asset(temp_handler, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path

    def build(ctx):
        ctx.progress(50, "half")
        ctx.add_asset("report", b"a,b\n1,2\n", name="out.csv")
        return {"rows": 1}

    temp_handler("t.build", build)
    job = services.enqueue("t.build", {})
    assert drain() == 1
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result == {"rows": 1}
    asset = job.assets.get()
    assert asset.content_type == "text/csv" and asset.size == 8


def test_exception_retries_then_fails(temp_handler):
    def boom(ctx):
        raise ValueError(f"bad {ctx.attempt}")

    temp_handler("t.boom", boom, max_attempts=2, retry_backoff=0)
    job = services.enqueue("t.boom", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_message == "bad 2" and job.error_type == "ValueError"
    assert "ValueError" in job.traceback
    assert list(job.events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "requeue",
        "claim",
        "fail",
    ]


def test_non_retryable_and_partial(temp_handler):
    def nope(ctx):
        raise NonRetryable("no point")

    def half(ctx):
        raise Partial("2 of 3 files", result={"done": 2})

    temp_handler("t.nope", nope, max_attempts=5)
    temp_handler("t.half", half)
    a = services.enqueue("t.nope", {})
    b = services.enqueue("t.half", {})
    drain()
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.status == Status.FAILED and a.attempts == 1
    assert b.status == Status.PARTIAL and b.result == {"done": 2} and b.error_message == "2 of 3 files"


def test_cooperative_cancel(temp_handler):
    def slow(ctx):
        services.request_cancel(ctx.job.pk, "api", "changed my mind")
        ctx.progress(10)
        raise AssertionError("progress should have raised CancelRequested")

    temp_handler("t.slow", slow)
    job = services.enqueue("t.slow", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


@override_settings(JOBSTATE={"CANCEL_GRACE_SECONDS": 0.5, "HEARTBEAT_SECONDS": 0.2})
def test_ignored_cancel_is_stopped_after_grace(temp_handler):
    def stubborn(ctx):
        services.request_cancel(ctx.job.pk, "api")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except Exception as exc:  # a handler that swallows everything still gets stopped
                del exc
        raise AssertionError("not interrupted")

    temp_handler("t.stubborn", stubborn)
    job = services.enqueue("t.stubborn", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 0.2})
def test_timeout_fails_the_attempt(temp_handler):
    def forever(ctx):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.05)

    temp_handler("t.forever", forever, timeout=0.5, max_attempts=1)
    job = services.enqueue("t.forever", {})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "Timeout"


def test_unknown_handler_fails_without_retry():
    job = services.enqueue("test.echo", {})
    Job.objects.filter(pk=job.pk).update(kind="gone.away")
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_type == "UnknownKind"


def test_stale_worker_result_is_discarded(temp_handler):
    def taken_away(ctx):
        services.requeue(ctx.job.pk, "admin", "operator took it back")
        return {"late": True}

    temp_handler("t.taken", taken_away)
    job = services.enqueue("t.taken", {})
    (claimed,) = services.claim("w1")
    assert run_job(claimed, "w1") == "lost"
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.result is None


def test_cancel_requested_raises_in_check(temp_handler):
    seen = {}

    def checker(ctx):
        assert not ctx.cancel_requested
        services.request_cancel(ctx.job.pk, "api")
        try:
            ctx.check_cancelled()
        except CancelRequested:
            seen["raised"] = True
            raise

    temp_handler("t.check", checker)
    job = services.enqueue("t.check", {})
    drain()
    job.refresh_from_db()
    assert seen == {"raised": True} and job.status == Status.CANCELLED
