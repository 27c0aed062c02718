"""Deleting a job (or an asset) removes the job's own files, and nothing else."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.core.files.storage import FileSystemStorage
from django.urls import reverse

from jobstate import services
from jobstate.models import Asset, Job
from tests.api_support import completed

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings: Any, tmp_path: Any) -> Any:
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def add_file(job: Job, name: str = "r.csv") -> Asset:
    return services.add_asset(job, asset_type="report", name=name, content=b"a,b\n")


def admin_delete(admin_client: Any, job: Job) -> None:
    response = admin_client.post(reverse("admin:jobstate_job_delete", args=[job.pk]), {"post": "yes"})
    assert response.status_code == 302 and not Job.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("where", ["another job's file", "another app's media"])
def test_deleting_a_job_deletes_no_file_outside_its_folder(
    admin_client: Any, user: Any, media: Any, caplog: Any, django_capture_on_commit_callbacks: Any, where: str
) -> None:
    # A row naming another file (hand-edited, say) took that file with it.
    job = completed(user)
    asset = add_file(job)
    if where == "another job's file":
        kept = media / str(add_file(completed(user)).file.name)
    else:
        (media / "avatars").mkdir()
        kept = media / "avatars" / "me.png"
        kept.write_bytes(b"theirs")
    own = media / str(asset.file.name)
    Asset.objects.filter(pk=asset.pk).update(file=str(kept.relative_to(media)))
    with (
        caplog.at_level(logging.WARNING, logger="jobstate"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        admin_delete(admin_client, job)
    assert kept.exists()
    assert own.exists()  # an orphan now, which remove_orphan_files sweeps
    assert any(str(asset.pk) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_deleting_a_job_deletes_its_files(
    admin_client: Any, user: Any, media: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = completed(user)
    files = [media / str(add_file(job).file.name) for _ in range(2)]
    assert all(f.exists() for f in files)
    with django_capture_on_commit_callbacks(execute=True):
        admin_delete(admin_client, job)
    assert not any(f.exists() for f in files)


def test_deleting_a_job_removes_its_folder(
    admin_client: Any, user: Any, media: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # It stayed, empty, until the next jobstate_prune swept it.
    job, other = completed(user), completed(user)
    for owner_job in (job, job, other):
        add_file(owner_job)
    folder = media / "jobstate" / str(job.pk)
    with django_capture_on_commit_callbacks(execute=True):
        admin_delete(admin_client, job)
    assert not folder.exists()
    assert (media / "jobstate" / str(other.pk)).is_dir()


def test_deleting_the_last_asset_of_a_job_that_remains_keeps_its_folder(
    user: Any, media: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # The job may be storing another file there at this instant.
    job = completed(user)
    asset = add_file(job)
    with django_capture_on_commit_callbacks(execute=True):
        asset.delete()
    assert not (media / str(asset.file.name)).exists()
    assert (media / "jobstate" / str(job.pk)).is_dir()


@pytest.fixture
def overwriting(media: Any, monkeypatch: Any) -> FileSystemStorage:
    """A storage that overwrites a file of the same name, as django-storages' S3 does by default."""
    storage = FileSystemStorage(location=media, allow_overwrite=True)
    monkeypatch.setattr(Asset._meta.get_field("file"), "storage", storage)
    return storage


def test_two_assets_of_one_name_in_a_job_keep_their_own_files(
    user: Any, overwriting: FileSystemStorage, django_capture_on_commit_callbacks: Any
) -> None:
    # They shared one file: the first one's download was the second's content, and
    # deleting either deleted both's.
    job = completed(user)
    first = services.add_asset(job, asset_type="report", name="r.csv", content=b"first")
    second = services.add_asset(job, asset_type="report", name="r.csv", content=b"second")
    assert first.file.name != second.file.name
    assert all(a.file.name.startswith(f"jobstate/{job.pk}/") for a in (first, second))
    with django_capture_on_commit_callbacks(execute=True):
        first.delete()
    assert not overwriting.exists(first.file.name)
    assert overwriting.open(second.file.name).read() == b"second"
