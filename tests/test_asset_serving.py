"""Which stored file an asset's download may open: only one inside its own job's folder
of the storage (``jobstate/<job id>/``), in the API and the admin alike."""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from typing import Any

import pytest
from django.core.files.base import ContentFile, File
from django.core.files.storage import FileSystemStorage, Storage
from django.urls import reverse

from jobstate import services
from jobstate.models import Asset
from tests.api_support import assert_error, client_for, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings: Any, tmp_path: Any) -> Any:
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


class MemoryStorage(Storage):
    """An object storage's shape: names only, no local paths, no links."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def _save(self, name: str, content: Any) -> str:
        self.files[name] = b"".join(content.chunks())
        return name

    def _open(self, name: str, mode: str = "rb") -> File[bytes]:
        if name not in self.files:
            raise FileNotFoundError(name)
        return File(io.BytesIO(self.files[name]), name=name)

    def exists(self, name: str) -> bool:
        return name in self.files

    def delete(self, name: str) -> None:
        self.files.pop(name, None)

    def size(self, name: str) -> int:
        return len(self.files[name])

    def url(self, name: str | None) -> str:
        return f"https://bucket.example/{name}"


@pytest.fixture
def memory(monkeypatch: Any) -> MemoryStorage:
    storage = MemoryStorage()
    monkeypatch.setattr(Asset._meta.get_field("file"), "storage", storage)
    return storage


def add_file(job: Any, content: bytes = b"mine\n") -> Asset:
    return services.add_asset(job, asset_type="report", name="r.csv", content=content)


def api_download(user: Any, asset: Asset) -> Any:
    return client_for(user).get(f"/api/assets/{asset.pk}/download/")


def admin_download(client: Any, asset: Asset) -> Any:
    return client.get(reverse("admin:jobstate_asset_download", args=[asset.pk]))


def warned(caplog: Any, asset: Asset) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "jobstate" and r.levelno == logging.WARNING and str(asset.pk) in r.getMessage()
    ]


def point_at(asset: Asset, name: str) -> None:
    Asset.objects.filter(pk=asset.pk).update(file=name)


def test_a_file_in_the_jobs_folder_is_served(user: Any) -> None:
    asset = add_file(running(user))
    assert asset.file.name.startswith(f"jobstate/{asset.job_id}/")
    response = api_download(user, asset)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"mine\n"


def _elsewhere(user: Any, other_user: Any, media: Any, where: str) -> str:
    """The stored name of a file outside the job's folder, that exists."""
    if where == "other app":
        (media / "avatars").mkdir()
        (media / "avatars" / "me.png").write_bytes(b"theirs")
        return "avatars/me.png"
    theirs = add_file(running(other_user if where == "other owner's job" else user), b"theirs")
    name = str(theirs.file.name)
    return name if where != "dot-dot" else name.replace("jobstate/", "jobstate/x/../", 1)


WHERE = ["other app", "other owner's job", "own other job", "dot-dot"]


@pytest.mark.parametrize("where", WHERE)
def test_the_api_serves_no_file_outside_the_jobs_folder(
    user: Any, other_user: Any, media: Any, caplog: Any, where: str
) -> None:
    # A hand-edited row (or one a renaming storage wrote) was served to the asset's owner.
    asset = add_file(running(user))
    point_at(asset, _elsewhere(user, other_user, media, where))
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        error = assert_error(api_download(user, asset), 404, "not_found")
    assert error["message"] == "The asset's file cannot be served."
    assert len(warned(caplog, asset)) == 1 and "job's folder" in warned(caplog, asset)[0]


@pytest.mark.parametrize("where", WHERE)
def test_the_admin_serves_no_file_outside_the_jobs_folder(
    admin_client: Any, client: Any, staff_user: Any, other_user: Any, media: Any, caplog: Any, where: str
) -> None:
    # Its download follows the API's rules, for staff and for an owner (staff without view rights).
    asset = add_file(running(staff_user))
    client.force_login(staff_user)
    assert admin_download(client, asset).status_code == 200
    point_at(asset, _elsewhere(staff_user, other_user, media, where))
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        assert admin_download(admin_client, asset).status_code == 404
        assert admin_download(client, asset).status_code == 404
    assert len(warned(caplog, asset)) == 2


def test_an_object_storage_serves_the_jobs_own_files_only(
    user: Any, other_user: Any, memory: MemoryStorage, caplog: Any
) -> None:
    asset = add_file(running(user))
    theirs = add_file(running(other_user), b"theirs")
    assert set(memory.files) == {asset.file.name, theirs.file.name}
    response = api_download(user, asset)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"mine\n"

    memory.save("avatars/me.png", ContentFile(b"other app"))
    for name in (theirs.file.name, "avatars/me.png"):
        point_at(asset, name)
        with caplog.at_level(logging.WARNING, logger="jobstate"):
            assert_error(api_download(user, asset), 404, "not_found")
    assert len(warned(caplog, asset)) == 2


def test_an_object_storages_missing_file_is_a_404(
    user: Any, admin_client: Any, memory: MemoryStorage
) -> None:
    asset = add_file(running(user))
    memory.files.clear()
    error = assert_error(api_download(user, asset), 404, "not_found")
    assert "missing" in error["message"]
    assert admin_download(admin_client, asset).status_code == 404


# On a file system: no symbolic link is followed, whatever its name says.


def _link_out(asset: Asset, media: Any, where: str) -> None:
    """Make ``asset``'s stored name (in its job's folder) lead elsewhere through a link."""
    stored = media / str(asset.file.name)
    if where == "file to another app's media":
        (media / "avatars").mkdir()
        (media / "avatars" / "me.png").write_bytes(b"theirs")
        stored.unlink()
        stored.symlink_to(media / "avatars" / "me.png")
    elif where == "file to a file of the same job":
        (stored.parent / "other.csv").write_bytes(b"theirs")
        stored.unlink()
        stored.symlink_to("other.csv")
    else:  # the job's folder, to another job's folder holding a file of the same name
        other = media / "jobstate" / "elsewhere"
        other.mkdir()
        (other / stored.name).write_bytes(b"theirs")
        for file in stored.parent.iterdir():
            file.unlink()
        stored.parent.rmdir()
        stored.parent.symlink_to(other, target_is_directory=True)


LINKS = ["file to another app's media", "file to a file of the same job", "job's folder to another folder"]


@pytest.mark.parametrize("where", LINKS)
def test_no_symbolic_link_is_followed(
    user: Any, admin_client: Any, media: Any, caplog: Any, where: str
) -> None:
    asset = add_file(running(user))
    _link_out(asset, media, where)
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        error = assert_error(api_download(user, asset), 404, "not_found")
        assert admin_download(admin_client, asset).status_code == 404
    assert error["message"] == "The asset's file cannot be served."
    assert len(warned(caplog, asset)) == 2


class DecryptingStorage(FileSystemStorage):
    """A subclass that reads its files its own way: still no link out of the job's folder."""

    def _open(self, name: str, mode: str = "rb") -> File[bytes]:
        file = super()._open(name, mode)
        return File(io.BytesIO(file.read().upper()), name=name)


def test_a_file_system_storage_that_opens_files_its_own_way_follows_no_link_out(
    user: Any, media: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(Asset._meta.get_field("file"), "storage", DecryptingStorage(location=media))
    asset = add_file(running(user))
    assert b"".join(api_download(user, asset).streaming_content) == b"MINE\n"
    _link_out(asset, media, "file to another app's media")
    assert_error(api_download(user, asset), 404, "not_found")


def test_a_media_root_reached_through_a_link_is_served(user: Any, settings: Any, tmp_path: Any) -> None:
    # A deployment's MEDIA_ROOT may itself be a link (to a mounted volume, say).
    (tmp_path / "volume").mkdir()
    (tmp_path / "media").symlink_to(tmp_path / "volume", target_is_directory=True)
    settings.MEDIA_ROOT = tmp_path / "media"
    asset = add_file(running(user))
    response = api_download(user, asset)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"mine\n"
    assert response["Content-Length"] == "5"


def test_a_stored_name_that_is_not_a_regular_file_is_refused_without_waiting(
    user: Any, media: Any, caplog: Any
) -> None:
    # Opening a named pipe for reading waited for a writer: the request hung.
    asset = add_file(running(user))
    stored = media / str(asset.file.name)
    stored.unlink()
    os.mkfifo(stored)
    threading.Thread(target=_unblock, args=(stored,), daemon=True).start()  # (a hang would be the bug)
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        assert_error(api_download(user, asset), 404, "not_found")
    assert len(warned(caplog, asset)) == 1


def _unblock(fifo: Any) -> None:
    """Open ``fifo`` for writing once a reader waits on it (for up to 5 seconds)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError:  # ENXIO: no reader yet
            time.sleep(0.05)


def test_a_folder_swapped_for_a_link_after_the_check_is_refused(
    user: Any, media: Any, monkeypatch: Any, caplog: Any
) -> None:
    # The check resolved the name to one file; the open, an instant later, reached another.
    asset = add_file(running(user))
    stored = media / str(asset.file.name)
    (stored.parent / "checked.csv").write_bytes(b"checked")
    realpath = os.path.realpath

    def resolved_before_the_swap(path: Any) -> str:
        real = realpath(path)
        return str(stored.parent / "checked.csv") if real == str(stored) else real

    monkeypatch.setattr(os.path, "realpath", resolved_before_the_swap)
    with caplog.at_level(logging.WARNING, logger="jobstate"):
        assert_error(api_download(user, asset), 404, "not_found")
    assert len(warned(caplog, asset)) == 1
