"""Assets of a dead attempt are hidden from results; orphan files are pruned (issue 10)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.core.management import call_command
from django.utils import timezone

from jobstate import services
from jobstate.models import Asset, Job
from jobstate.states import Status
from tests.api_support import client_for, job_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def reap() -> None:
    services.requeue_expired(now=timezone.now() + timedelta(hours=1))


def test_each_asset_records_its_attempt_and_a_reaped_attempt_s_assets_are_hidden(media, user):
    job = services.enqueue("test.echo", {}, owner=user, max_attempts=3)
    (first,) = services.claim("w1", limit=1)
    first = services.begin(first, first.lease_token, "w1").job
    services.add_asset(first, asset_type="report", name="a.csv", content=b"1", token=first.lease_token)
    reap()  # worker w1 was killed: attempt 1 is lost
    (second,) = services.claim("w2", limit=1, now=timezone.now() + timedelta(hours=1))
    second = services.begin(second, second.lease_token, "w2", now=timezone.now() + timedelta(hours=1)).job
    services.add_asset(second, asset_type="report", name="b.csv", content=b"2", token=second.lease_token)
    services.complete(second, second.lease_token, {"ok": True})

    rows = {a.name: (a.attempt, a.attempt_lost) for a in Asset.objects.filter(job=job)}
    assert rows == {"a.csv": (1, True), "b.csv": (2, False)}
    assert [a.name for a in services.result_assets(job)] == ["b.csv"]
    listed = client_for(user).get(job_url(job, "assets/")).json()["results"]
    assert [a["name"] for a in listed] == ["b.csv"]
    # The list of all one's assets and the download agree with the job's list.
    assert [a["name"] for a in client_for(user).get("/api/assets/").json()["results"]] == ["b.csv"]
    lost = Asset.objects.get(name="a.csv")
    assert client_for(user).get(f"/api/assets/{lost.pk}/download/").status_code == 404


def test_an_attempt_its_worker_ended_keeps_its_assets(media):
    job = services.enqueue("test.echo", {}, max_attempts=3)
    (first,) = services.claim("w1", limit=1)
    first = services.begin(first, first.lease_token, "w1").job
    services.add_asset(first, asset_type="log", name="try1.txt", content=b"x", token=first.lease_token)
    services.fail(first, first.lease_token, "flaky", retry_delay=0)  # recorded by its worker
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert [a.name for a in services.result_assets(job)] == ["try1.txt"]


def test_an_operator_requeue_or_fail_of_a_running_job_hides_that_attempt_s_assets(media):
    for end in (services.requeue, services.force_fail):
        job = services.enqueue("test.echo", {})
        (running,) = services.claim("w1", limit=1)
        services.add_asset(running, asset_type="x", name="x.bin", content=b"x", token=running.lease_token)
        end(job, "ops", "stuck")
        assert list(services.result_assets(job)) == []


def test_assets_stored_without_a_lease_have_no_attempt_and_stay_visible(media):
    job = services.enqueue("test.echo", {})
    asset = services.add_asset(job, asset_type="input", name="in.csv", content=b"1")
    assert asset.attempt is None
    reap()
    assert list(services.result_assets(job)) == [asset]


def write(media: Path, name: str, age_seconds: float) -> Path:
    path = media / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan")
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


def test_prune_removes_old_orphan_files_and_keeps_the_rest(media):
    job = services.enqueue("test.echo", {})
    kept = services.add_asset(job, asset_type="r", name="kept.csv", content=b"1")
    old_kept = Path(storages["default"].path(kept.file.name))
    os.utime(old_kept, (time.time() - 7200, time.time() - 7200))
    orphan = write(media, f"jobstate/{job.pk}/never-committed.csv", 7200)
    young = write(media, f"jobstate/{job.pk}/uploading.csv", 10)
    other = write(media, "elsewhere/not-ours.csv", 7200)

    assert services.remove_orphan_files(dry_run=True) == [f"jobstate/{job.pk}/never-committed.csv"]
    assert orphan.exists()
    out = StringIO()
    call_command("jobstate_prune", stdout=out)
    assert "1 orphan file(s)" in out.getvalue()
    assert not orphan.exists() and young.exists() and old_kept.exists() and other.exists()


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York"])
def test_the_orphan_sweep_runs_with_use_tz_false(media, settings, zone):
    """Without time zone support the cutoff is naive: it was compared with the file's
    time made aware, a TypeError that stopped every prune once a job folder held a file."""
    settings.USE_TZ, settings.TIME_ZONE = False, zone
    job = services.enqueue("test.echo", {})
    orphan = write(media, f"jobstate/{job.pk}/never-committed.csv", 7200)
    young = write(media, f"jobstate/{job.pk}/uploading.csv", 10)
    assert services.remove_orphan_files() == [f"jobstate/{job.pk}/never-committed.csv"]
    assert not orphan.exists() and young.exists()
