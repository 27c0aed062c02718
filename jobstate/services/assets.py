"""Files linked to the job that produced them."""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import os
from typing import IO, Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile, File
from django.db import transaction
from django.db.models.fields.files import FieldFile
from django.utils.text import get_valid_filename

from jobstate.exceptions import LeaseLost
from jobstate.models import Asset, Job
from jobstate.states import Status

logger = logging.getLogger("jobstate")


def safe_name(name: str) -> str:
    """A file name with no path, no control characters, nothing a shell or a
    Content-Disposition header could misread."""
    base = os.path.basename(str(name).replace("\\", "/")).strip()
    try:
        cleaned = get_valid_filename(base)
    except Exception:  # SuspiciousFileOperation for "", ".", ".."
        cleaned = ""
    return cleaned[:200] or "file"


def add_asset(
    job: Job | UUID | str,
    *,
    asset_type: str,
    name: str = "",
    content: bytes | str | IO[bytes] | File | None = None,
    url: str = "",
    content_type: str = "",
    metadata: dict[str, Any] | None = None,
    token: UUID | str | None = None,
) -> Asset:
    """Store ``content`` through Django's storage (or record an external ``url``)
    and link it to ``job``. With ``token``, the caller must still hold the lease.

    The lease is checked before the upload (a stale worker uploads nothing) and
    again, under a row lock, in the transaction that saves the asset. If that
    transaction fails the stored file is deleted. Known limits: a crash between
    the upload and the commit, or an enclosing transaction rolled back after
    this returns, leaves an orphan file in storage.
    """
    if not asset_type:
        raise ValidationError({"asset_type": ["An asset type is required."]})
    if content is None and not url:
        raise ValidationError({"content": ["Give file content or an external URL."]})
    pk = job.pk if isinstance(job, Job) else job
    row = Job.objects.filter(pk=pk).values_list("owner_id", "status", "lease_token").first()
    if row is None:
        raise Job.DoesNotExist(f"Job {pk} does not exist")
    owner_id, status, lease_token = row
    if token is not None and (status != Status.PROCESSING or str(lease_token) != str(token)):
        raise LeaseLost(pk)
    filename = safe_name(name or (url.rsplit("/", 1)[-1] if url else "") or asset_type)
    asset = Asset(
        job_id=pk,
        owner_id=owner_id,
        asset_type=asset_type[:100],
        name=filename,
        url=url,
        metadata=metadata or {},
        content_type=content_type or mimetypes.guess_type(filename)[0] or "application/octet-stream",
    )
    if content is not None:
        file = _as_file(content, filename)
        digest = hashlib.sha256()
        size = 0
        for chunk in file.chunks():
            digest.update(chunk)
            size += len(chunk)
        file.seek(0)
        asset.sha256 = digest.hexdigest()
        asset.size = size
        asset.file.save(filename, file, save=False)
        asset.storage_path = asset.file.name
    try:
        with transaction.atomic():
            if token is not None and not _lock_if_held(pk, token):
                raise LeaseLost(pk)
            asset.save()
    except BaseException:
        if asset.file:
            _discard(asset.file)
        raise
    return asset


def _lock_if_held(pk: Any, token: UUID | str) -> bool:
    """Lock the job row if the lease is still ``token``'s: until this transaction
    ends, the job cannot end or change hands, so the asset lands under the lease."""
    held = Job.objects.select_for_update().filter(pk=pk, status=Status.PROCESSING, lease_token=token)
    return held.values_list("pk", flat=True).first() is not None


def _discard(file: FieldFile) -> None:
    try:
        file.storage.delete(file.name)
    except Exception:  # keep the original error; the file is an orphan now
        logger.exception("Could not delete stored file %s", file.name)


def _as_file(content: bytes | str | IO[bytes] | File, name: str) -> File:
    if isinstance(content, File):
        return content
    if isinstance(content, str):
        return ContentFile(content.encode(), name=name)
    if isinstance(content, bytes | bytearray):
        return ContentFile(bytes(content), name=name)
    return File(content, name=name)


def delete_stored_file(asset: Asset) -> None:
    """Remove an asset's stored file once the deleting transaction commits."""
    if not asset.file:
        return
    storage, name = asset.file.storage, asset.file.name
    transaction.on_commit(lambda: storage.delete(name))
