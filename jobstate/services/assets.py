"""Files linked to the job that produced them."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mimetypes
import os
import re
from typing import IO, Any, cast
from urllib.parse import urlsplit
from uuid import UUID

from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile, File
from django.core.files.storage import Storage
from django.db import transaction
from django.db.models import Subquery
from django.http import FileResponse, HttpRequest
from django.utils.cache import patch_cache_control
from django.utils.text import get_valid_filename

from jobstate.exceptions import LeaseLost
from jobstate.models import Asset, Job
from jobstate.models.asset import job_folder
from jobstate.services import ranges
from jobstate.services.asset_files import in_job_folder, open_stored
from jobstate.states import Status
from jobstate.storable import json_value, text

logger = logging.getLogger("jobstate")


def safe_name(name: str) -> str:
    """A file name with no path, no control characters, nothing a shell or a
    Content-Disposition header could misread."""
    base = os.path.basename(str(name).replace("\\", "/")).strip()
    try:
        cleaned = get_valid_filename(base)
    except Exception:  # SuspiciousFileOperation for "", ".", ".."
        cleaned = ""
    if cleaned.startswith((".", "-")):
        # Not a hidden file (".htaccess" in a served directory; "😀.txt" became
        # ".txt") nor one a command reads as an option ("-rf").
        cleaned = "file" + cleaned
    return _fit(cleaned) or "file"


NAME_MAX_BYTES = 200  # of a file system's 255 per name: room for the asset id's 37 and a storage's "_abc1234"


def _fit(name: str) -> str:
    """``name`` cut to NAME_MAX_BYTES in UTF-8, its extension kept (200 accented
    characters were 400 bytes: "File name too long" when the file was saved)."""
    if len(name.encode()) <= NAME_MAX_BYTES:
        return name
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem or len(extension.encode()) > 20:
        stem, extension = name, ""
    else:
        extension = "." + extension
    room = NAME_MAX_BYTES - len(extension.encode())
    return stem.encode()[:room].decode("utf-8", "ignore") + extension


def add_asset(
    job: Job | UUID | str,
    *,
    asset_type: str,
    name: str = "",
    content: bytes | str | IO[bytes] | File[bytes] | None = None,
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
    this returns, leaves an orphan file in storage (``remove_orphan_files``,
    run by ``jobstate_prune``, deletes it). With ``token`` the asset records its
    attempt; if that attempt is later lost (its worker killed, the job reaped or
    taken by an operator) the asset is hidden from the job's results
    (``result_assets``).
    """
    _check_line(asset_type, "asset_type", 100, required=True)
    _check_line(url, "url", 2000)
    if url:
        _check_url(url)
    if content_type:
        _check_line(content_type, "content_type", 200)
        if not _is_media_type(content_type):
            raise ValidationError({"content_type": ["A media type, such as text/csv."]})
    if metadata is not None and not isinstance(metadata, dict):
        raise ValidationError({"metadata": ["A JSON object."]})
    metadata = json_value(metadata or {}, "metadata")
    if content is None and not url:
        raise ValidationError({"content": ["Give file content or an external URL."]})
    pk = job.pk if isinstance(job, Job) else job
    row = Job.objects.filter(pk=pk).values_list("owner_id", "status", "lease_token", "attempts").first()
    if row is None:
        raise Job.DoesNotExist(f"Job {pk} does not exist")
    owner_id, status, lease_token, attempt = row
    if token is not None and (status != Status.PROCESSING or str(lease_token) != str(token)):
        raise LeaseLost(pk)
    filename = safe_name(name or (url.rsplit("/", 1)[-1] if url else "") or asset_type)
    asset = Asset(
        job_id=pk,
        owner_id=owner_id,
        asset_type=asset_type,
        name=filename,
        url=url,
        metadata=metadata,
        content_type=content_type or mimetypes.guess_type(filename)[0] or "application/octet-stream",
        # Under a lease: the attempt that holds it (the lock below keeps it current).
        attempt=attempt if token is not None else None,
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
        asset.storage_path = cast(str, asset.file.name)  # set by save()
    try:
        with transaction.atomic():
            if token is not None and not _lock_if_held(pk, token):
                raise LeaseLost(pk)
            asset.save()
    except BaseException:
        if asset.file.name:  # (a FieldFile is true when it has a name)
            _discard(asset.file.storage, asset.file.name)
        raise
    return asset


def _check_line(value: Any, field: str, limit: int, *, required: bool = False) -> None:
    """One line of text within ``limit`` characters, as both databases store it and
    a response header can carry it (``content_type``)."""
    if not isinstance(value, str):
        raise ValidationError({field: ["A string."]})
    if required and not value.strip():
        raise ValidationError({field: ["Required."]})
    if len(value) > limit:
        raise ValidationError({field: [f"At most {limit} characters."]})
    if text(value) != value or any(c < " " or c == "\x7f" for c in value):
        raise ValidationError({field: ["No control characters, NUL or lone surrogates."]})


def _is_media_type(value: str) -> bool:
    """Printable ASCII with a "/", as ``add_asset`` stores a content type: one line
    a response header can carry."""
    return value.isascii() and "/" in value and not any(c < " " or c == "\x7f" for c in value)


def _check_url(url: str) -> None:
    """An absolute http(s) URL: the API hands ``url`` to clients, which may show
    it as a link (``javascript:`` or ``data:`` would run there). Any host name,
    as object storage inside a cluster has (``http://minio:9000/...``)."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a malformed host or port
        ok = False
    if not ok:
        raise ValidationError({"url": ["An absolute http or https URL."]})


def _lock_if_held(pk: Any, token: UUID | str) -> bool:
    """Lock the job row if the lease is still ``token``'s: until this transaction
    ends, the job cannot end or change hands, so the asset lands under the lease."""
    held = Job.objects.select_for_update().filter(pk=pk, status=Status.PROCESSING, lease_token=token)
    return held.values_list("pk", flat=True).first() is not None


def _discard(storage: Storage, name: str) -> None:
    try:
        storage.delete(name)
    except Exception:  # keep the original error; the file is an orphan now
        logger.exception("Could not delete stored file %s", name)


def _as_file(content: bytes | str | IO[bytes] | File[bytes], name: str) -> File[bytes]:
    if isinstance(content, File):
        return content
    if isinstance(content, str):
        return ContentFile(content.encode(), name=name)
    if isinstance(content, bytes | bytearray):
        return ContentFile(bytes(content), name=name)
    return File(content, name=name)


def delete_stored_file(asset: Asset) -> None:
    """Remove an asset's stored file once the deleting transaction commits: only
    a file inside its job's folder, as a download opens only those.

    ``robust``: a storage that fails (a network error, a permission) is logged, and
    the rest goes on (the next files of a pruned batch, the next batch, the request
    that deleted the job); the file is left to ``remove_orphan_files``."""
    name = asset.file.name
    if not name:  # (a FieldFile is false exactly when it has no name)
        return
    if not in_job_folder(name, asset.job_id):  # another job's file, another app's: not this job's to delete
        logger.warning(
            "Asset %s: its stored file name %r is not inside its job's folder: kept", asset.pk, name
        )
        return
    storage, job_id = asset.file.storage, asset.job_id

    def delete() -> None:
        storage.delete(name)
        _remove_job_folder(storage, job_id)

    transaction.on_commit(delete, robust=True)


def _remove_job_folder(storage: Storage, job_id: Any) -> None:
    """A file system's folder of a deleted job, once its last file is gone (else
    it waited for ``remove_orphan_files``). A job that still exists keeps it: it
    may be storing a file there at this instant."""
    try:
        path = storage.path(job_folder(job_id))
    except NotImplementedError:  # no local paths (object storages have no folders)
        return
    with contextlib.suppress(OSError):  # not empty, or gone already
        if os.listdir(path) or Job.objects.filter(pk=job_id).exists():
            return
        os.rmdir(path)


def file_response(asset: Asset, request: HttpRequest | None = None) -> FileResponse:
    """Stream ``asset``'s stored file as an attachment under its safe name (OSError
    when the storage cannot open it). Whatever the project's middleware: ``nosniff``,
    so a browser keeps the stored type (an HTML or SVG file is not run as a page),
    and ``private``, so no shared cache keeps one user's file for another.

    With the ``request``, a GET's (or HEAD's) single ``Range`` is answered 206 with
    those bytes only (a client resumes a download, a player seeks), unless its
    ``If-Range`` names another version than the ``ETag`` (the file's sha256);
    RangeNotSatisfiable for a range past the end (416). A HEAD reads no byte. The
    file is sent as stored, never compressed by ``GZipMiddleware``.

    A row written outside ``add_asset`` (an old version's, a hand-edited one) is
    logged at WARNING: a stored name outside the job's own folder (another job's
    file, another app's, ``..``, absolute) raises UnservableFile (a 404), see
    ``asset_files.open_stored``; a content type no header can carry is sent as
    ``application/octet-stream``."""
    file = open_stored(asset)
    try:
        return _file_response(asset, file, request)
    except BaseException:
        file.close()  # the response that would have closed it is not returned
        raise


def _file_response(asset: Asset, file: IO[bytes], request: HttpRequest | None) -> FileResponse:
    response = FileResponse(
        file,
        as_attachment=True,
        filename=safe_name(asset.name),
        content_type=_served_type(asset),
    )
    response["X-Content-Type-Options"] = "nosniff"
    patch_cache_control(response, private=True)
    etag = f'"{asset.sha256}"' if _SHA256.fullmatch(asset.sha256) else ""
    if etag:
        response["ETag"] = etag
    # A storage's file that cannot tell its size (not seekable) is sent whole.
    response["Accept-Ranges"] = "bytes" if "Content-Length" in response else "none"
    if request is None:
        return response
    # A host project's GZipMiddleware compresses streaming responses, but not for a
    # request that accepts no gzip (its documented rule, read after the view): a 206
    # would keep the Content-Range of the file's own bytes, a 200 lose its length and
    # get a weak ETag no If-Range matches. Files are sent as stored.
    request.META.pop("HTTP_ACCEPT_ENCODING", None)
    if request.method in ("GET", "HEAD") and response["Accept-Ranges"] == "bytes":
        _serve_range(response, file, request, etag)
    if request.method == "HEAD":
        response.streaming_content = iter(())
    return response


def _served_type(asset: Asset) -> str:
    if _is_media_type(asset.content_type):
        return asset.content_type
    if asset.content_type:
        logger.warning(
            "Asset %s: its content type %r is not one a header can carry; sent as application/octet-stream",
            asset.pk,
            asset.content_type,
        )
    return "application/octet-stream"


def _serve_range(response: FileResponse, file: IO[bytes], request: HttpRequest, etag: str) -> None:
    """Make ``response`` the 206 of the request's ``Range`` if it has one to honour."""
    if not ranges.if_range_holds(request.headers.get("If-Range"), etag):
        return  # checked first: a range of another version may be past this one's end
    size = int(response["Content-Length"])
    span = ranges.byte_range(request.headers.get("Range"), size)
    if span is None:
        return
    first, last = span
    file.seek(first)
    response.status_code = 206
    response["Content-Range"] = f"bytes {first}-{last}/{size}"
    response["Content-Length"] = last - first + 1
    response.streaming_content = ranges.read_span(file, last - first + 1, response.block_size)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def result_assets(job: Job | UUID | str) -> Any:
    """The assets that belong to ``job``'s results, oldest first: every asset but
    those of an attempt that was lost (``Asset.objects.visible()``). The API and
    ``manage.py jobstate show`` list these; the admin's job page lists them first, then
    the lost ones, marked."""
    pk = job.pk if isinstance(job, Job) else job
    return Asset.objects.visible().filter(job_id=pk).order_by("created_at", "pk")


def lose_attempt_assets(job_id: Any) -> int:
    """Inside the transaction that takes a processing job from its worker (before
    its ``attempts`` change): hide the assets its current attempt stored."""
    current = Job.objects.filter(pk=job_id).values("attempts")[:1]
    return Asset.objects.filter(job_id=job_id, attempt=Subquery(current), attempt_lost=False).update(
        attempt_lost=True
    )
