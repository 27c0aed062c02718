"""The orphan-file sweep reads the root folder of a file system storage a bounded
number of names at a time, and no more once its deadline has passed; another
storage's (no local paths) is read with ``Storage.listdir``, all at once."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, InMemoryStorage

from jobstate import services
from jobstate.services import orphans

pytestmark = pytest.mark.django_db


def orphan(media: Path) -> str:
    path = media / "jobstate" / str(uuid.uuid4()) / "never-committed.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"orphan")
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    return str(path.relative_to(media))


@pytest.fixture
def reads(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The reads of the root folder (os.scandir's), which FileSystemStorage.listdir must not list."""
    settings.MEDIA_ROOT = tmp_path
    root = str(tmp_path / "jobstate")
    listdir, scandir = FileSystemStorage.listdir, os.scandir
    held: list[str] = []

    def whole(self: FileSystemStorage, name: str) -> Any:
        assert name.rstrip("/") != "jobstate", "the root folder listed at once"
        return listdir(self, name)

    def counted(path: Any = ".") -> Any:
        if str(path) == root:
            held.append(root)
        return scandir(path)

    monkeypatch.setattr(FileSystemStorage, "listdir", whole)
    monkeypatch.setattr(os, "scandir", counted)
    return held


def test_a_file_system_storage_is_read_a_few_folders_at_a_time(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Storage.listdir of the root held every job folder's name at once: millions of
    # them in memory, and the whole read before the deadline was ever looked at.
    monkeypatch.setattr(orphans, "FOLDERS_PER_READ", 2)
    names = sorted(orphan(tmp_path) for _ in range(5))
    assert services.remove_orphan_files() == names  # in name order, in 3 reads of 2, 2 and 1
    assert len(reads) == 3
    assert not any((tmp_path / name).exists() for name in names)


def test_a_sweep_past_its_deadline_reads_the_root_folder_no_more(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(orphans, "FOLDERS_PER_READ", 1)
    names = sorted(orphan(tmp_path) for _ in range(3))
    sweeps = [services.sweep_orphan_files(deadline=0) for _ in range(3)]
    assert [s.removed for s in sweeps] == [[name] for name in names]
    assert [s.more for s in sweeps] == [True, True, False] and len(reads) == 3  # one read each
    assert not (tmp_path / "jobstate" / orphans.RESUME_NOTE).exists()


def test_a_storage_without_local_paths_is_listed_and_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = InMemoryStorage()
    monkeypatch.setattr(orphans, "_storage", lambda: storage)
    names = sorted(storage.save(f"jobstate/{uuid.uuid4()}/x.csv", ContentFile(b"x")) for _ in range(3))
    sweeps = [services.sweep_orphan_files(older_than=timedelta(0), deadline=0) for _ in range(3)]
    assert [s.removed for s in sweeps] == [[name] for name in names]
    assert [s.more for s in sweeps] == [True, True, False]
    assert not any(storage.exists(name) for name in names)
