"""Files (or external URLs) produced by a job."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import Storage
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobstate.ids import new_id


def job_folder(job_id: object) -> str:
    """The folder of the assets' storage that holds ``job_id``'s files (with its "/")."""
    return f"jobstate/{job_id}/"


def asset_upload_to(instance: Asset, filename: str) -> str:
    # The asset's id first: a storage that overwrites (django-storages' S3 by default)
    # gave two assets of one name a single file, and deleting either took both's.
    return f"{job_folder(instance.job_id)}{instance.pk}_{filename}"


def _asset_storage():  # type: ignore[no-untyped-def]
    from django.core.files.storage import InvalidStorageError, storages

    from jobstate import conf

    alias = conf.get("STORAGE")
    try:
        return storages[alias]
    except InvalidStorageError:
        # Asked as the model is imported: a traceback then would stop every command,
        # ``manage.py check`` included, which names the problem (jobstate.E004).
        return UnknownStorage(alias)


class UnknownStorage(Storage):
    """Stands for a ``JOBSTATE["STORAGE"]`` alias missing from ``settings.STORAGES``:
    every use raises ImproperlyConfigured, naming it."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def _fail(self, *args: object, **kwargs: object) -> Any:
        raise ImproperlyConfigured(
            f"JOBSTATE['STORAGE'] is {self.alias!r}, which is not a key of settings.STORAGES."
        )

    _open = _save = delete = exists = listdir = size = url = path = _fail


class AssetQuerySet(models.QuerySet["Asset"]):
    def visible(self) -> AssetQuerySet:
        """Assets that belong to a job's results: not written by an attempt that was
        lost (killed, or taken from its worker by the reaper or an operator)."""
        return self.filter(attempt_lost=False)


class Asset(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of their own: jobstate_asset_job_idx and jobstate_asset_owner_idx lead
    # with them and serve every lookup by job or owner (two index entries fewer per file).
    job = models.ForeignKey("jobstate.Job", on_delete=models.CASCADE, related_name="assets", db_index=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobstate_assets",
        db_index=False,
    )
    asset_type = models.CharField(max_length=100)
    name = models.CharField(max_length=255, help_text="Safe display and download file name.")
    file = models.FileField(upload_to=asset_upload_to, storage=_asset_storage, max_length=500, blank=True)
    url = models.URLField(max_length=2000, blank=True, default="")
    storage_path = models.CharField(max_length=500, blank=True, default="")
    size = models.PositiveBigIntegerField(default=0)
    content_type = models.CharField(max_length=200, blank=True, default="")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(
        null=True, blank=True, help_text="The job's attempt that stored it (empty: not stored under a lease)."
    )
    attempt_lost = models.BooleanField(
        default=False,
        help_text="Its attempt did not end by its own worker (killed, reaped or taken by an operator): "
        "hidden from the job's results.",
    )

    objects = AssetQuerySet.as_manager()

    class Meta:
        ordering = ("created_at",)
        indexes = [
            models.Index(fields=["job", "created_at"], name="jobstate_asset_job_idx"),
            models.Index(fields=["owner", "-created_at"], name="jobstate_asset_owner_idx"),
            # The asset admin: newest first, and by type (its filter and choices).
            models.Index(fields=["-created_at"], name="jobstate_asset_created_idx"),
            models.Index(fields=["asset_type", "-created_at"], name="jobstate_asset_type_idx"),
            # The admin's "Lost attempts" filter: rare rows, so a partial index keeps it
            # instant on a large table and costs no write for the assets of results.
            models.Index(
                fields=["-created_at"], condition=Q(attempt_lost=True), name="jobstate_asset_lost_idx"
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(file="") | ~Q(url=""), name="jobstate_asset_file_or_url"),
        ]

    def __str__(self) -> str:
        return f"{self.asset_type}: {self.name}"

    @property
    def web_url(self) -> str:
        """``url`` if it is an http(s) one, else "": a row stored before ``add_asset``
        checked the scheme may hold ``javascript:``, or a URL that does not parse."""
        try:
            scheme = urlsplit(self.url).scheme
        except ValueError:  # an unclosed IPv6 bracket, say
            return ""
        return self.url if scheme in ("http", "https") else ""
