"""Opening an asset's stored file to serve it: only a file inside its own job's
folder of the storage.

``add_asset`` stores every file under ``jobstate/<job id>/``; a row that names
anything else (another job's file, another app's media) was written by hand or
by a storage that renames files, and its owner must not be handed that file."""

from __future__ import annotations

import logging
from typing import NoReturn

from django.core.exceptions import SuspiciousOperation
from django.core.files.base import File
from django.core.files.storage import Storage

from jobstate.exceptions import UnservableFile
from jobstate.models import Asset
from jobstate.models.asset import job_folder

logger = logging.getLogger("jobstate")


def in_job_folder(name: str, job_id: object) -> bool:
    """``name`` (a storage's name) lies inside ``job_id``'s folder, with no ``..``."""
    folder = job_folder(job_id)
    if not name.startswith(folder) or "\\" in name or "\x00" in name:
        return False
    return all(part not in ("", ".", "..") for part in name[len(folder) :].split("/"))


def open_stored(asset: Asset) -> File[bytes]:
    """The opened file of ``asset`` (OSError when the storage cannot open it);
    UnservableFile, logged at WARNING, for a file outside its job's folder."""
    name = str(asset.file.name)
    storage: Storage = asset.file.storage
    if not in_job_folder(name, asset.job_id):
        _refuse(asset, f"it is not inside its job's folder {job_folder(asset.job_id)}")
    try:
        return storage.open(name, "rb")
    except SuspiciousOperation as exc:  # a storage's SuspiciousFileOperation
        _refuse(asset, str(exc))


def _refuse(asset: Asset, why: str) -> NoReturn:
    logger.warning("Asset %s: its stored file name %r cannot be served: %s", asset.pk, asset.file.name, why)
    raise UnservableFile(asset.pk)
