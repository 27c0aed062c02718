"""Stored files no Asset row names (orphans): an upload whose row was never
committed (a crash between the two, a rolled-back transaction), or a file whose
deletion failed when its job was pruned.

A sweep with a deadline goes through the job folders in name order and stops
between two once the deadline has passed, noting where in a small file beside
them (``jobstate/.orphan-sweep``): the next sweep with a deadline goes on from
there to the last folder, and the one after it starts again at the first. So
sweeps each cut short by their time budget still cover every folder in turn. The
note is a hint only: without it (unreadable, or never written) a sweep starts at
the first folder.

A ``FileSystemStorage`` (or a subclass) has its root folder read
``FOLDERS_PER_READ`` names at a time (the smallest left after the last one taken:
each read is one pass over the folder with ``os.scandir``, holding that many names),
and a sweep past its deadline reads no more: millions of job folders are never held
in memory at once. Another storage has only ``Storage.listdir``, which returns every
name of the root folder at once: its first read is as large as the folder."""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.utils import timezone

from jobstate.models import Asset, Job
from jobstate.models.asset import asset_upload_to

logger = logging.getLogger("jobstate")

RESUME_NOTE = ".orphan-sweep"  # under the root folder, where no job folder is a file
FOLDERS_PER_READ = 10_000  # job folder names held at once (a storage with local paths)


@dataclass
class OrphanSweep:
    removed: list[str] = field(default_factory=list)  # the names removed (or that would be)
    more: bool = False  # stopped at its deadline: folders are left for the next sweep


def remove_orphan_files(*, older_than: timedelta = timedelta(hours=1), dry_run: bool = False) -> list[str]:
    """Delete stored files under ``jobstate/`` that no Asset row names (an upload
    whose row was never committed: a crash between the two, or a rolled-back
    transaction). Files younger than ``older_than`` are kept (an upload may be
    about to commit its row), as are files whose age the storage cannot tell.
    Returns the names removed (or, with ``dry_run``, that would be)."""
    return sweep_orphan_files(older_than=older_than, dry_run=dry_run).removed


def sweep_orphan_files(
    *, older_than: timedelta = timedelta(hours=1), dry_run: bool = False, deadline: float | None = None
) -> OrphanSweep:
    """``remove_orphan_files``, stopping between job folders once ``time.monotonic()``
    passes ``deadline`` (after one folder at least): ``more`` is then set, and the
    next sweep with a deadline starts after the last folder this one looked at."""
    storage = _storage()
    root = asset_upload_to(Asset(job_id="x"), "").split("/", 1)[0]  # "jobstate"
    sweep = OrphanSweep()
    # The folders before it had their turn in the earlier sweeps of this round.
    after = _resume_after(storage, root) if deadline is not None else None
    cutoff = timezone.now() - older_than
    last: str | None = None  # the last folder looked at
    for job_dirs, final in _job_dirs(storage, root, after):
        for job_dir in job_dirs:
            if last is not None and _past(deadline):
                return _stopped(sweep, storage, root, last, dry_run)
            sweep.removed += _sweep_folder(storage, root, job_dir, cutoff, dry_run)
            last = job_dir
        if not final and last is not None and _past(deadline):  # no further read of the root
            return _stopped(sweep, storage, root, last, dry_run)
    if after is not None and not dry_run:  # the round is complete: the next one starts at the first
        _note_resume(storage, root, None)
    return sweep


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _stopped(sweep: OrphanSweep, storage: Any, root: str, last: str, dry_run: bool) -> OrphanSweep:
    sweep.more = True
    if not dry_run:
        _note_resume(storage, root, last)
    return sweep


def _job_dirs(storage: Any, root: str, after: str | None) -> Iterator[tuple[list[str], bool]]:
    """The job folders after ``after``, in name order, in lists, each with whether it
    is the last: ``FOLDERS_PER_READ`` names each, read when asked for, from a
    ``FileSystemStorage``; else all in one (``Storage.listdir`` has no smaller read)."""
    if not isinstance(storage, FileSystemStorage):  # (``path()`` is no sign: InMemoryStorage has one)
        try:
            dirs, _files = storage.listdir(root)
        except (FileNotFoundError, NotImplementedError):
            return
        yield sorted(d for d in dirs if after is None or d > after), True
        return
    path = storage.path(root)
    while True:
        try:
            with os.scandir(path) as entries:
                names = (e.name for e in entries if (after is None or e.name > after) and _is_dir(e))
                # One more than it takes: whether any is left after them (a sweep that stops
                # after the last one does not say more remains).
                job_dirs = heapq.nsmallest(FOLDERS_PER_READ + 1, names)
        except (FileNotFoundError, NotADirectoryError):
            return
        final = len(job_dirs) <= FOLDERS_PER_READ
        yield job_dirs[:FOLDERS_PER_READ], final
        if final:
            return
        after = job_dirs[FOLDERS_PER_READ - 1]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # as FileSystemStorage.listdir: a link to a folder is one
    except OSError:  # gone meanwhile, or unreadable
        return False


def _storage() -> Any:
    storage = Asset._meta.get_field("file").storage
    return storage() if callable(storage) else storage


def _sweep_folder(storage: Any, root: str, job_dir: str, cutoff: datetime, dry_run: bool) -> list[str]:
    try:
        _sub, files = storage.listdir(f"{root}/{job_dir}")
    except (FileNotFoundError, NotImplementedError):
        return []
    names = [f"{root}/{job_dir}/{f}" for f in files]
    known = set(Asset.objects.filter(file__in=names).values_list("file", flat=True))
    left = len(names)
    removed: list[str] = []
    for name in names:
        if name in known or not _older(storage, name, cutoff):
            continue
        if not dry_run:
            storage.delete(name)
            left -= 1
        removed.append(name)
    if not dry_run and not left and not _sub:
        _remove_empty_dir(storage, f"{root}/{job_dir}", job_dir)
    return removed


def _resume_after(storage: Any, root: str) -> str | None:
    try:
        with storage.open(f"{root}/{RESUME_NOTE}", "rb") as note:
            return str(note.read(200).decode()) or None
    except Exception:  # any storage's "not found" (or an unreadable note): start at the first folder
        return None


def _note_resume(storage: Any, root: str, after: str | None) -> None:
    """Write (or with None remove) the note; a failure only costs the next sweep its start."""
    name = f"{root}/{RESUME_NOTE}"
    try:
        storage.delete(name)
        if after is not None:
            saved = storage.save(name, ContentFile(after.encode()))
            if saved != name:  # another sweep wrote it meanwhile: the storage picked a free name
                storage.delete(saved)
    except Exception:
        logger.warning("jobstate: could not note where the orphan-file sweep stopped", exc_info=True)


def _remove_empty_dir(storage: Any, name: str, job_dir: str) -> None:
    """A file system's directory of a job that is gone (pruned: it can store no
    more files), left empty once its files were deleted: each would otherwise be
    listed again by every later clean-up."""
    try:
        pk = UUID(job_dir)
        path = storage.path(name)
    except (ValueError, NotImplementedError):  # not a job's directory; no local paths
        return
    if Job.objects.filter(pk=pk).exists():
        return
    with contextlib.suppress(OSError):  # not empty after all, or gone already
        os.rmdir(path)


def _older(storage: Any, name: str, cutoff: datetime) -> bool:
    try:
        modified: datetime = storage.get_modified_time(name)
    except (NotImplementedError, OSError):
        return False
    # Naive without USE_TZ (the storage's and Django's clocks alike, in TIME_ZONE):
    # compared aware, each made so the same way.
    if timezone.is_naive(modified):
        modified = timezone.make_aware(modified)
    if timezone.is_naive(cutoff):
        cutoff = timezone.make_aware(cutoff)
    return modified < cutoff
