"""Opening an asset's stored file to serve it: only a file inside its own job's
folder of the storage, and on a file system never through a symbolic link.

``add_asset`` stores every file under ``jobstate/<job id>/``; a row that names
anything else (another job's file, another app's media) was written by hand or
by a storage that renames files, and its owner must not be handed that file."""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import NoReturn

from django.core.exceptions import SuspiciousOperation
from django.core.files.base import File
from django.core.files.storage import FileSystemStorage, Storage

from jobstate.exceptions import UnservableFile
from jobstate.models import Asset
from jobstate.models.asset import job_folder

logger = logging.getLogger("jobstate")

_NO_LINK = getattr(os, "O_NOFOLLOW", 0)  # (none on Windows: the realpath check stands alone)
_FLAGS = os.O_RDONLY | _NO_LINK | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


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
        if isinstance(storage, FileSystemStorage):
            return _open_on_disk(asset, storage, name)
        return storage.open(name, "rb")
    except SuspiciousOperation as exc:  # a storage's SuspiciousFileOperation
        _refuse(asset, str(exc))


def _open_on_disk(asset: Asset, storage: FileSystemStorage, name: str) -> File[bytes]:
    path = storage.path(name)
    folder = os.path.join(os.path.realpath(storage.location), *job_folder(asset.job_id).split("/"))
    real = os.path.realpath(path)
    if not real.startswith(folder):  # (folder ends with the separator)
        _refuse(asset, "a symbolic link leads out of its job's folder")
    own_open = getattr(getattr(storage, "_open", None), "__func__", None)
    if own_open is not getattr(FileSystemStorage, "_open", None):
        return storage.open(name, "rb")  # a subclass that reads files its own way (decrypting, say)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse(asset, "it is a symbolic link")
        raise
    try:
        opened = os.fstat(fd)
        # A folder swapped for a link since realpath() looked opens another file.
        if not stat.S_ISREG(opened.st_mode) or not os.path.samestat(opened, os.stat(real)):
            _refuse(asset, "it is not the regular file its name leads to")
        return File(os.fdopen(fd, "rb"), name=name)
    except BaseException:
        os.close(fd)
        raise


def _refuse(asset: Asset, why: str) -> NoReturn:
    logger.warning("Asset %s: its stored file name %r cannot be served: %s", asset.pk, asset.file.name, why)
    raise UnservableFile(asset.pk)
