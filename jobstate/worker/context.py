"""What a handler receives: its job, parameters, and calls back into the service layer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import IO, Any, cast
from uuid import UUID

from django.core.files import File
from django.db import DatabaseError, connection, transaction

from jobstate import conf, services
from jobstate.exceptions import CancelRequested, LeaseLost
from jobstate.models import Asset, Job
from jobstate.registry import HandlerSpec

logger = logging.getLogger("jobstate.worker")


def lease_token(job: Job) -> UUID:
    """The token of the lease this worker holds on ``job`` (the field is empty only
    on a job nobody holds)."""
    return cast(UUID, job.lease_token)


class JobContext:
    """Passed to every handler. All writes carry the lease token, so a worker that
    lost its lease can no longer change the job.

    Progress is coalesced: ``progress()`` writes at most once per
    ``JOBSTATE["PROGRESS_FLUSH_SECONDS"]`` (0: every call). A report that comes
    sooner is kept in memory (the latest value wins) and written by the worker
    process's heartbeat thread when its time comes, or with the job's outcome.
    """

    def __init__(self, job: Job, spec: HandlerSpec, worker_id: str, leased_at: float | None = None) -> None:
        self.job = job
        self.spec = spec
        self.worker_id = worker_id
        self.token = lease_token(job)
        self.parameters: dict[str, Any] = job.parameters or {}
        self.attempt: int = job.attempts
        # Set by the worker process's heartbeat; read by handlers without a query.
        self.cancel_seen = threading.Event()
        self.stop_seen = threading.Event()
        self.lease_lost = threading.Event()
        # Set by a workflow once it runs its undos (a failure's compensation, or a
        # cancel's with ``undo_on_cancel``): a pending cancel no longer stops it (the
        # watchdog's cancel grace period does not count; the job's timeout bounds it).
        self.compensating = threading.Event()
        # Coalesced progress: the reports not yet written (the arguments of
        # report_progress, latest wins), when they are due, and when the last
        # write went out. ``_writing`` serialises writes (handler and heartbeat).
        self._state = threading.Lock()
        self._writing = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._due: float | None = None
        self._written_at = -float("inf")
        # What take_progress handed to an outcome: a failed outcome write is
        # followed by another (the failure), which must store it too.
        self._taken: dict[str, Any] = {}
        # Called (by progress) when a report is left for the heartbeat to write.
        self.on_pending: Callable[[], None] | None = None
        # When the lease runs out, on this process's monotonic clock: from the
        # start of the write that began the job (``leased_at``; None: it just
        # ended), then from the start of each write that renewed it (heartbeats,
        # progress). The watchdog reads it. Never from the stored expiry: that is
        # on the database's clock (PostgreSQL), this machine's may be off.
        since = time.monotonic() if leased_at is None else leased_at
        self.lease_until = since + float(conf.get("LEASE_SECONDS"))
        # When the job began (monotonic): django-q2's hard limit for it runs from
        # about then (``limits.hard_limit_for``; a worker's chain re-arms it per job).
        self.began = since

    def renewed(self, since: float) -> None:
        """A write that started at ``since`` (monotonic) renewed the lease."""
        with self._state:  # the handler's thread and the heartbeat's
            self.lease_until = max(self.lease_until, since + float(conf.get("LEASE_SECONDS")))

    def progress(
        self, percent: float | None = None, message: str | None = None, *, step: str | None = None
    ) -> None:
        """Store progress; raises ``CancelRequested`` when a cancel is pending and
        ``LeaseLost`` once this worker no longer holds the job."""
        services.progress_fields(percent, message, step)  # invalid values fail here, now
        if self.lease_lost.is_set():
            raise LeaseLost(self.job.pk)
        if self.cancel_seen.is_set():
            raise CancelRequested(self.job.pk)
        report = {
            k: v for k, v in (("percent", percent), ("message", message), ("step", step)) if v is not None
        }
        flush = float(conf.get("PROGRESS_FLUSH_SECONDS") or 0)
        if flush <= 0:
            # Serialised with the heartbeat's flush of a kept report: that older
            # report must not land after this newer one.
            with self._writing:
                self._write_or_keep(report, flush)
            return
        notify = False
        with self._state:
            self._pending = {**(self._pending or {}), **report}
            now = time.monotonic()
            if now - self._written_at >= flush and self._writing.acquire(blocking=False):
                report, self._pending, self._due, self._written_at = self._pending, None, None, now
            else:
                notify = self._due is None
                self._due = max(now, self._written_at + flush)
                report = {}
        if not report:
            if notify and self.on_pending is not None:
                self.on_pending()
            return
        try:
            self._write_or_keep(report, flush)
        finally:
            self._writing.release()

    def _write_or_keep(self, report: dict[str, Any], flush: float) -> None:
        """The handler's write: one the database refuses (unreachable, a lock wait
        ended) is kept for the heartbeat to write, as the heartbeat keeps its own,
        rather than failing the attempt. Inside the handler's own transaction the
        error is the handler's: that transaction can go no further."""
        with self._state:
            if self._pending:  # kept from a refused write: this newer report goes with it
                report, self._pending, self._due = {**self._pending, **report}, None, None
        try:
            self._write(report)
        except DatabaseError:
            with self._state:
                self._pending = {**report, **(self._pending or {})}
                self._due = time.monotonic() + max(flush, 1.0)
            if connection.in_atomic_block:
                raise
            logger.warning(
                "Job %s: progress not written; the heartbeat will retry", self.job.pk, exc_info=True
            )
            if self.on_pending is not None:
                self.on_pending()

    def _write(self, report: dict[str, Any]) -> None:
        since = time.monotonic()
        try:
            services.report_progress(
                self.job, self.token, report.get("percent"), report.get("message"), step=report.get("step")
            )
            # The lease is renewed once the write is committed (never, if the
            # caller's transaction rolls back).
            transaction.on_commit(lambda: self.renewed(since))
        except CancelRequested:
            self.cancel_seen.set()
            raise
        except LeaseLost:
            self.lease_lost.set()
            raise

    def progress_due(self, now: float) -> float | None:
        """When the heartbeat should write the pending report (None: nothing pending)."""
        return self._due if self._pending else None

    def flush_progress(self) -> None:
        """Write the pending report now (the heartbeat thread, when it is due)."""
        retry = max(float(conf.get("PROGRESS_FLUSH_SECONDS") or 0), 1.0)
        # Bounded: the handler's write holds this lock, and an interrupt landing in
        # the handler between taking it and its try block would never give it back
        # (this heartbeat then stuck for every later job). The report stays pending;
        # the outcome stores it in the end.
        if not self._writing.acquire(timeout=retry):
            with self._state:
                if self._pending:
                    self._due = time.monotonic() + retry
            return
        try:
            # The report stays pending until it is written: an outcome stored
            # meanwhile (which refuses this write) takes it too.
            with self._state:
                report, self._due = self._pending, None
                self._written_at = time.monotonic()
            if not report:
                return
            try:
                self._write(report)
            except (CancelRequested, LeaseLost):
                raise
            except Exception:
                # Not written (the database is unreachable, or a lock wait ended):
                # kept for the next try, with any report made since.
                with self._state:
                    if self._pending:
                        self._due = time.monotonic() + retry
                raise
            with self._state:
                if self._pending is report:  # no newer report came meanwhile
                    self._pending = None
        finally:
            self._writing.release()

    def take_progress(self) -> dict[str, Any]:
        """The pending report as Job fields, to be stored with the outcome.

        Waits for a write the heartbeat has under way: the report it took may be
        the last one, and once the outcome is stored that write is refused (lease
        lost) and the report gone. Bounded, as in ``flush_progress``.

        What it returns is returned again (with any later report) by the next
        call: when the outcome's write fails, the failure recorded instead
        stores the same last report."""
        wait = max(float(conf.get("PROGRESS_FLUSH_SECONDS") or 0), 1.0)
        taken = self._writing.acquire(timeout=wait)
        try:
            with self._state:
                report, self._pending, self._due = self._pending, None, None
        finally:
            if taken:
                self._writing.release()
        if report:
            percent, message, step = report.get("percent"), report.get("message"), report.get("step")
            self._taken = {**self._taken, **services.progress_fields(percent, message, step)}
        return dict(self._taken)

    def heartbeat(self) -> None:
        """Renew the lease now; raises ``CancelRequested`` when a cancel is pending."""
        since = time.monotonic()
        beat = services.heartbeat(self.job, self.token)
        transaction.on_commit(lambda: self.renewed(since))
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
        content: bytes | str | IO[bytes] | File[bytes] | None = None,
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
