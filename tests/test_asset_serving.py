"""Which stored file an asset's download may open: only one inside its own job's folder
of the storage (``jobstate/<job id>/``), in the API and the admin alike."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from django.core.files.base import ContentFile, File
from django.core.files.storage import Storage
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
