"""Races the service layer must survive: each test makes the other party act at
the worst moment (inside the call) and checks nothing leaks or aborts."""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from jobstate import LeaseLost, services
from jobstate.exceptions import AlreadyRetried, InvalidTransition
from jobstate.models import Asset, Job
from jobstate.services import assets, cascade, control, retries
from jobstate.states import Status
from tests.api_support import JOBS, assert_error, client_for

enqueue = import_module("jobstate.services.enqueue")  # the package attribute is the function

pytestmark = pytest.mark.django_db


def test_cancelling_a_parent_tolerates_a_child_that_just_finished(monkeypatch):
    parent = services.enqueue("test.echo", {})
    services.start(parent, "w-parent")
    first = services.enqueue("test.echo", {"n": 1}, parent=parent)
    second = services.enqueue("test.echo", {"n": 2}, parent=parent)
    running = services.start(first, "w-child")
    real_chunks = cascade._chunks

    def child_finishes_first(ids: list[Any]) -> list[list[Any]]:
        # The parent has listed its active children; one of them ends now.
        if Job.objects.filter(pk=first.pk, status=Status.PROCESSING).exists():
            services.complete(running, running.lease_token, {"done": True})
        return real_chunks(ids)

    monkeypatch.setattr(cascade, "_chunks", child_finishes_first)
    result = services.request_cancel(parent, "api", "not needed")
    assert result.status == Status.PROCESSING and result.cancel_requested_at is not None
    assert Job.objects.get(pk=first.pk).status == Status.COMPLETED
    assert Job.objects.get(pk=second.pk).status == Status.CANCELLED


def test_a_lease_lost_during_the_upload_writes_nothing(settings, tmp_path, monkeypatch):
    settings.MEDIA_ROOT = tmp_path
    services.enqueue("test.echo", {})
    (job,) = services.claim("w1", lease_seconds=1)
    real_as_file = assets._as_file

    def reaper_runs_meanwhile(content: Any, name: str) -> Any:
        services.requeue_expired(timezone.now() + timedelta(seconds=5))
        return real_as_file(content, name)

    monkeypatch.setattr(assets, "_as_file", reaper_runs_meanwhile)
    with pytest.raises(LeaseLost):
        services.add_asset(job, asset_type="report", name="r.csv", content=b"late", token=job.lease_token)
    assert not Asset.objects.exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_failed_asset_save_removes_the_stored_file(settings, tmp_path, monkeypatch):
    settings.MEDIA_ROOT = tmp_path
    services.enqueue("test.echo", {})
    (job,) = services.claim("w1")

    def broken_save(self: Asset, *args: Any, **kwargs: Any) -> None:
        raise IntegrityError("simulated")

    monkeypatch.setattr(Asset, "save", broken_save)
    with pytest.raises(IntegrityError):
        services.add_asset(job, asset_type="report", name="r.csv", content=b"x", token=job.lease_token)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_asset_with_a_live_lease_is_stored(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    services.enqueue("test.echo", {})
    (job,) = services.claim("w1")
    asset = services.add_asset(job, asset_type="report", name="r.csv", content=b"abc", token=job.lease_token)
    assert Asset.objects.get().pk == asset.pk and (tmp_path / asset.file.name).read_bytes() == b"abc"


def test_enqueue_retries_when_the_conflicting_job_ended_before_the_second_lookup(monkeypatch):
    holder = services.enqueue("test.echo", {}, key="k")
    real_lookup = enqueue._existing_for_key
    calls: list[int] = []

    def stale_then_gone(*args: Any, **kwargs: Any) -> Job | None:
        calls.append(1)
        if len(calls) == 1:
            return None  # looked before ``holder`` was inserted
        if Job.objects.filter(pk=holder.pk, status=Status.QUEUED).exists():
            services.request_cancel(holder, "api")  # ...and it ended before the second look
        return real_lookup(*args, **kwargs)

    monkeypatch.setattr(enqueue, "_existing_for_key", stale_then_gone)
    job, created = services.get_or_enqueue("test.echo", {}, key="k", watermark=3)
    assert created and job.pk != holder.pk and job.input_watermark == 3
    assert Job.objects.filter(key="k", status__in=["queued", "processing"]).get().pk == job.pk


def test_enqueue_never_lets_an_integrity_error_out(monkeypatch):
    services.enqueue("test.echo", {}, key="k")
    monkeypatch.setattr(enqueue, "_existing_for_key", lambda *args, **kwargs: None)
    with pytest.raises(services.DuplicateActiveKey):
        services.get_or_enqueue("test.echo", {}, key="k")
    assert Job.objects.count() == 1


def test_the_api_answers_a_lost_key_race_with_409_not_500(user, monkeypatch):
    services.enqueue("test.echo", {}, owner=user, key="k")
    monkeypatch.setattr(enqueue, "_existing_for_key", lambda *args, **kwargs: None)
    response = client_for(user).post(JOBS, {"kind": "test.echo", "key": "k"}, format="json")
    assert_error(response, 409, "duplicate_active_key")
    assert Job.objects.count() == 1


def _stale_first_read(monkeypatch: pytest.MonkeyPatch, stale: Job) -> None:
    """request_cancel's first read of the job returns ``stale``: the status it saw
    just before another party moved the job."""
    real_get = control._get
    reads: list[Any] = []

    def get(job: Any) -> Job:
        reads.append(job)
        return stale if len(reads) == 1 else real_get(job)

    monkeypatch.setattr(control, "_get", get)


def test_a_job_claimed_as_it_is_cancelled_is_asked_to_stop_not_cancelled_under_its_worker(monkeypatch):
    job = services.enqueue("test.echo", {}, key="once")
    stale = Job.objects.get(pk=job.pk)  # queued, as the caller saw it
    (claimed,) = services.claim("w1")
    _stale_first_read(monkeypatch, stale)
    result = services.request_cancel(job, "api", "not needed")
    # Its worker holds it: asked, not cancelled (which would free the key and the
    # slot while the handler still runs).
    assert result.status == Status.PROCESSING and result.cancel_requested_at is not None
    assert result.lease_token == claimed.lease_token
    assert list(result.events.order_by("id").values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "request_cancel",
    ]


def test_a_parent_that_suspends_as_it_is_cancelled_is_cancelled_with_its_children(monkeypatch):
    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1")
    child = services.enqueue("test.echo", {}, parent=held)
    stale = Job.objects.get(pk=parent.pk)  # processing, as the caller saw it
    services.suspend(held, held.lease_token)  # the fan-out: it waits for its child
    _stale_first_read(monkeypatch, stale)
    result = services.request_cancel(parent, "api", "not needed")
    assert result.status == Status.CANCELLED  # not left waiting for a child it cancelled
    assert Job.objects.get(pk=child.pk).status == Status.CANCELLED


def test_a_parent_that_finishes_as_it_is_cancelled_is_refused_and_its_children_kept(monkeypatch):
    parent = services.enqueue("test.echo", {})
    (held,) = services.claim("w1")
    child = services.enqueue("test.echo", {}, parent=held)
    stale = Job.objects.get(pk=parent.pk)
    services.complete(held, held.lease_token, {"done": True})
    _stale_first_read(monkeypatch, stale)
    with pytest.raises(InvalidTransition):
        services.request_cancel(parent, "api", "not needed")
    assert Job.objects.get(pk=child.pk).status == Status.QUEUED  # a finished parent's child runs on


def test_an_operator_requeue_grants_an_attempt_spent_after_it_looked(monkeypatch):
    services.enqueue("test.echo", {}, max_attempts=1)
    (reserved,) = services.claim("w1")  # reserved by a cluster: no attempt spent yet
    stale = Job.objects.get(pk=reserved.pk)
    services.begin(reserved, reserved.lease_token, "w1:1")  # now it is: 1 of 1
    lease = Job.objects.get(pk=reserved.pk).lease_expires_at
    _stale_first_read(monkeypatch, stale)
    job = services.requeue(reserved, "admin", "stuck")
    assert (job.status, job.attempts, job.max_attempts) == (Status.QUEUED, 1, 2)
    assert job.run_after == lease  # w1's handler may run until then
    (again,) = services.claim("w2", now=lease)
    services.begin(again, again.lease_token, "w2:1")  # within the bounds the database checks
    assert Job.objects.get(pk=again.pk).attempts == 2


@pytest.mark.parametrize("until", [None, "tomorrow"])
def test_a_job_that_suspends_after_a_cancel_request_is_cancelled(until):
    # The request came while the handler ran; a suspend must not park it (until
    # tomorrow, or waiting for children) with the request still pending.
    services.enqueue("test.echo", {})
    (held,) = services.claim("w1")
    child = services.enqueue("test.echo", {}, parent=held)
    services.request_cancel(held, "api", "user gave up")
    later = timezone.now() + timedelta(days=1) if until else None
    moved = services.suspend(held, held.lease_token, until=later, reason="poll tomorrow")
    job = Job.objects.get(pk=held.pk)
    assert moved is not None and moved.status == job.status == Status.CANCELLED
    assert job.events.order_by("-id").values_list("transition", "reason")[0] == (
        "cancel",
        "cancel requested; the handler suspended (poll tomorrow)",
    )
    assert Job.objects.get(pk=child.pk).status == Status.CANCELLED  # with its children


def test_a_stop_for_a_job_that_finishes_as_it_is_asked_is_refused(monkeypatch):
    services.enqueue("test.echo", {})
    (held,) = services.claim("w1")
    stale = Job.objects.get(pk=held.pk)  # processing, as the caller saw it
    services.complete(held, held.lease_token, {"done": True})
    _stale_first_read(monkeypatch, stale)
    with pytest.raises(InvalidTransition) as info:
        services.request_stop(held, "ops", "done for today")
    assert (info.value.current, info.value.transition) == (Status.COMPLETED, "stop")
    job = Job.objects.get(pk=held.pk)
    assert job.stop_requested_at is None
    assert not job.events.filter(transition="request_stop").exists()


def test_a_stop_for_a_queued_job_that_ends_as_it_is_asked_is_refused_as_a_stop(monkeypatch):
    job = services.enqueue("test.echo", {})
    stale = Job.objects.get(pk=job.pk)  # queued and never served: the stop would cancel it
    services.force_fail(job, "ops", "gave up")
    _stale_first_read(monkeypatch, stale)
    with pytest.raises(InvalidTransition) as info:
        services.request_stop(job, "ops", "done for today")
    assert (info.value.current, info.value.transition) == (Status.FAILED, "stop")


def _deleted_by_retention_at(monkeypatch: pytest.MonkeyPatch, where: str, old: Job) -> None:
    """Retention deletes ``old`` when the retry reaches ``retries.<where>``, inside its transaction."""
    real = getattr(retries, where)

    def retention_runs_meanwhile(*args: Any, **kwargs: Any) -> Any:
        Job.objects.filter(pk=old.pk).delete()
        return real(*args, **kwargs)

    monkeypatch.setattr(retries, where, retention_runs_meanwhile)


# Its own transaction: the foreign key of retry_of is checked when it commits.
@pytest.mark.django_db(transaction=True)
def test_a_retry_of_a_job_deleted_meanwhile_says_the_job_is_gone(monkeypatch):
    # It was a DuplicateActiveKey "with key 'None'": the foreign key's error read as a key's.
    old = services.enqueue("test.echo", {})
    services.force_fail(old, "ops", "broken")
    _deleted_by_retention_at(monkeypatch, "lock_parent", old)
    with pytest.raises(Job.DoesNotExist, match=f"Job {old.pk} no longer exists"):
        services.retry(old, "ops", "again")
    assert not Job.objects.filter(retry_of=old.pk).exists()  # (the delete rolled back with it)


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_a_retry_of_a_job_deleted_meanwhile_with_404(user, monkeypatch):
    old = services.enqueue("test.echo", {}, owner=user)
    services.force_fail(old, "ops", "broken")
    _deleted_by_retention_at(monkeypatch, "lock_parent", old)
    assert_error(client_for(user).post(f"{JOBS}{old.pk}/retry/"), 404, "not_found")
    assert not Job.objects.filter(retry_of=old.pk).exists()


def test_a_job_is_retried_once_and_its_retry_names_the_refusal():
    old = services.enqueue("test.echo", {})
    services.force_fail(old, "ops", "broken")
    first = services.retry(old, "ops", "fixed")
    with pytest.raises(AlreadyRetried) as info:
        services.retry(old, "ops", "again")
    assert (info.value.job_id, info.value.retry_id) == (old.pk, first.pk)
    assert str(info.value) == f"Job {old.pk} was already retried as job {first.pk}: retry that one instead."
    assert list(Job.objects.filter(retry_of=old.pk)) == [first]
    services.force_fail(first, "ops", "broken again")
    assert services.retry(first, "ops", "the newest").retry_of_id == first.pk


@pytest.mark.django_db(transaction=True)  # two connections, each retry committing
def test_two_retries_of_one_job_at_once_make_one_new_job(monkeypatch):
    import threading

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL")
    old = services.enqueue("test.echo", {})
    services.force_fail(old, "ops", "broken")
    real = retries.get_or_enqueue
    other: dict[str, Any] = {}

    def second_retry() -> None:
        try:
            other["job"] = services.retry(old.pk, "ops", "second")
        except Exception as exc:
            other["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=second_retry)

    def the_other_retries_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not thread.is_alive() and not other:
            thread.start()
            thread.join(timeout=1)  # it waits for our lock (without it, it makes its own job)
        return real(*args, **kwargs)

    monkeypatch.setattr(retries, "get_or_enqueue", the_other_retries_meanwhile)
    first = services.retry(old, "ops", "first")
    thread.join(timeout=10)
    assert isinstance(other.get("error"), AlreadyRetried), other
    assert list(Job.objects.filter(retry_of=old.pk)) == [first]


def test_two_reapers_sweeping_one_expired_job_at_once_log_nothing(monkeypatch, caplog):
    """Every cluster's pusher runs the reaper: after an outage several sweep the same
    expired jobs. The one that read a job just before another requeued it leaves it
    without a word; each such job was logged as a WARNING, "Refused requeue on job
    ...: lease token does not match", by every other cluster (chaos trial)."""
    import logging

    from jobstate.services import reaper

    job = services.enqueue("test.echo", {})
    services.start(job, "w-lost")
    later = timezone.now() + timedelta(minutes=5)
    real_reap = reaper._reap
    other: list[services.ReapReport] = []
    raced: list[bool] = []

    def another_reaper_first(row, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not raced:  # the other sweep takes the job after this one read it
            raced.append(True)
            monkeypatch.setattr(reaper, "_reap", real_reap)
            other.append(services.requeue_expired(later))
        return real_reap(row, *args, **kwargs)

    monkeypatch.setattr(reaper, "_reap", another_reaper_first)
    caplog.set_level(logging.INFO, logger="jobstate")
    report = services.requeue_expired(later)
    assert other[0].requeued == [job.pk]
    assert not (report.requeued or report.failed or report.cancelled or report.skipped or report.errors)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert list(Job.objects.get(pk=job.pk).events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "requeue",
    ]
