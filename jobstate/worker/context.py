"""What a handler receives: its job, parameters, and calls back into the service layer."""

from __future__ import annotations

import threading
from typing import IO, Any

from django.core.files import File

from jobstate import services
from jobstate.exceptions import CancelRequested
from jobstate.models import Asset, Job
from jobstate.registry import HandlerSpec


class JobContext:
    """Passed to every handler. All writes carry the lease token, so a worker that
    lost its lease can no longer change the job."""

    def __init__(self, job: Job, spec: HandlerSpec, worker_id: str) -> None:
        self.job = job
        self.spec = spec
        self.worker_id = worker_id
        self.token = job.lease_token
        self.parameters: dict[str, Any] = job.parameters or {}
        self.attempt: int = job.attempts
        # Set by the background heartbeat; read by handlers without a query.
        self.cancel_seen = threading.Event()
        self.stop_seen = threading.Event()

    def progress(
        self, percent: float | None = None, message: str | None = None, *, step: str | None = None
    ) -> None:
        """Store progress; raises ``CancelRequested`` when a cancel is pending."""
        try:
            services.report_progress(self.job, self.token, percent, message, step=step)
        except CancelRequested:
            self.cancel_seen.set()
            raise

    def heartbeat(self) -> None:
        """Renew the lease now; raises ``CancelRequested`` when a cancel is pending."""
        beat = services.heartbeat(self.job, self.token)
        if beat.stop_requested:
            self.stop_seen.set()
        if beat.cancel_requested:
            self.cancel_seen.set()
            raise CancelRequested(self.job.pk)

    @property
    def cancel_requested(self) -> bool:
        if not self.cancel_seen.is_set() and (
            Job.objects.filter(pk=self.job.pk, cancel_requested_at__isnull=False).exists()
        ):
            self.cancel_seen.set()
        return self.cancel_seen.is_set()

    def check_cancelled(self) -> None:
        """Raise ``CancelRequested`` if a cancel was requested."""
        if self.cancel_requested:
            raise CancelRequested(self.job.pk)

    @property
    def stop_requested(self) -> bool:
        """For service-style jobs: a graceful stop was asked (see ``services.request_stop``)."""
        if not self.stop_seen.is_set() and (
            Job.objects.filter(pk=self.job.pk, stop_requested_at__isnull=False).exists()
        ):
            self.stop_seen.set()
        return self.stop_seen.is_set()

    def add_asset(
        self,
        asset_type: str,
        content: bytes | str | IO[bytes] | File | None = None,
        *,
        name: str = "",
        url: str = "",
        content_type: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> Asset:
        """Store a file through Django's storage and link it to this job."""
        return services.add_asset(
            self.job,
            asset_type=asset_type,
            name=name,
            content=content,
            url=url,
            content_type=content_type,
            metadata=metadata,
            token=self.token,
        )
