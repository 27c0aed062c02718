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
from jobstate.models import Asset, Job
from jobstate.services import assets, cascade
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
