"""What a step method receives: the job's context plus its step's cursor, the
outputs of earlier steps, checkpoints, batched iteration, child jobs and serving."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from types import MappingProxyType, TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction
from django.db.models import Q

from jobstate import conf, services
from jobstate.exceptions import CancelRequested, NonRetryable, UnknownKind
from jobstate.models import Asset, Job, JobStep
from jobstate.storable import text
from jobstate.workflows import spawns, step_waits, steps
from jobstate.workflows.items import LOOP, READ_AFTER, position_of, walk
from jobstate.workflows.spawns import REUSED, ChildSpec

if TYPE_CHECKING:
    from jobstate.workflows.definition import RunState, StepSpec

# No idempotency key: a key could hand back another job that is not this one's
# child (and so would never wake it). The fan-out is atomic instead.
CHILD_OPTIONS = frozenset({"priority", "run_after", "max_attempts"})


class StepContext:
    """Passed to each step (and undo) method. Writes carry the job's lease token:
    a worker that lost its lease can no longer change the job or its steps."""

    def __init__(self, run: RunState, spec: StepSpec, row: JobStep, *, undoing: bool = False) -> None:
        self._run = run
        self.job_context = run.ctx
        self.spec = spec
        self.step: str = spec.name
        self.step_attempt: int = row.attempts
        self.cursor: Any = row.cursor
        self._read_after: Any = (row.detail or {}).get(READ_AFTER)
        self._stored: dict[str, Any] = row.detail or {}  # spawns an earlier attempt's iteration stored
        self.undoing = undoing
        self.outputs: Mapping[str, Any] = MappingProxyType(dict(run.outputs))
        self.spawned: list[ChildSpec] = []
        self._iterated: int | None = None  # where in ``spawned`` the iteration's spawns begin
        self._loops = 0  # the iterate/batches loops begun, over nothing or not (``_iterating``)
        self._loop = 0  # which of them is the step's iteration
        self._saved = 0  # how many of the iteration's spawns are stored (``spawns.Stored``)
        self._fresh = True  # no checkpoint of this attempt stored spawns yet

    # The job -------------------------------------------------------------------

    @property
    def job(self) -> Job:
        return self.job_context.job

    @property
    def parameters(self) -> dict[str, Any]:
        return self.job_context.parameters

    @property
    def attempt(self) -> int:
        """The job's attempt number (``step_attempt`` counts this step's starts)."""
        return self.job_context.attempt

    @property
    def token(self) -> Any:
        return self.job_context.token

    @property
    def worker_id(self) -> str:
        return self.job_context.worker_id

    def heartbeat(self) -> None:
        """Renew the lease now; raises ``CancelRequested`` when a cancel is pending,
        except in an undo: a cancel does not stop a compensation (``cancel_requested``
        says whether one is pending)."""
        try:
            self.job_context.heartbeat()
        except CancelRequested:
            if not self.undoing:
                raise

    @property
    def cancel_requested(self) -> bool:
        return self.job_context.cancel_requested

    def check_cancelled(self) -> None:
        """Raise ``CancelRequested`` if a cancel was requested, except in an undo: a
        failure's compensation finishes whatever the cancel, and a cancel's undos
        (``undo_on_cancel``) are how it is honoured."""
        if not self.undoing:
            self.job_context.check_cancelled()

    @property
    def stop_requested(self) -> bool:
        return self.job_context.stop_requested

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
        return self.job_context.add_asset(
            asset_type, content, name=name, url=url, content_type=content_type, metadata=metadata
        )

    # Progress and checkpoints --------------------------------------------------

    def _job_percent(self, percent: float | None) -> float | None:
        if percent is None:
            return None
        low, high = self._run.band(self.spec)
        return low + (high - low) * min(100.0, max(0.0, float(percent))) / 100

    def progress(self, percent: float | None = None, message: str | None = None) -> None:
        """Progress *of this step* (0..100); the job's progress is placed within the
        step's share of the workflow. Raises ``CancelRequested`` when a cancel is pending."""
        try:
            services.report_progress(
                self.job, self.token, self._job_percent(percent), message, step=self.step
            )
        except CancelRequested:
            self.job_context.cancel_seen.set()
            if not self.undoing:
                raise

    def checkpoint(self, cursor: Any, *, percent: float | None = None, message: str | None = None) -> None:
        """Store ``cursor`` (any JSON) on this step, atomically and lease-checked. After a
        crash, a timeout or a retry the step starts again with ``ctx.cursor`` set to it."""
        self._checkpoint(cursor, percent=percent, message=message)

    def _checkpoint(
        self,
        cursor: Any,
        *,
        percent: float | None,
        message: str | None,
        detail: dict[str, Any] | None = None,
        spawned: spawns.Stored | None = None,
    ) -> None:
        self._active("checkpoint")
        if percent is not None:  # kept for a resumed run to begin at (``steps.resumed_percent``)
            detail = {**(detail or {}), steps.PERCENT: min(100.0, max(0.0, float(percent)))}
        try:
            steps.checkpoint(
                self.job,
                self.token,
                self.step,
                cursor,
                percent=self._job_percent(percent),
                message=message,
                detail=detail,
                spawned=spawned,
            )
        except CancelRequested:
            self.job_context.cancel_seen.set()
            raise
        self.cursor = cursor
        if detail and READ_AFTER in detail:
            self._read_after = detail[READ_AFTER]

    def _index(self) -> int:
        if self.cursor is None:
            return 0
        if isinstance(self.cursor, bool) or not isinstance(self.cursor, int) or self.cursor < 0:
            raise TypeError(f"iterate/batches need an item-count cursor; step has {self.cursor!r}")
        return self.cursor

    def _every(self, every: int | None) -> int:
        n = every or self.spec.batch or conf.get("WORKFLOW_BATCH")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError("the checkpoint interval is a positive integer")
        return n

    def _done(self, done: int, total: int | None, read_after: Any = None) -> None:
        """Checkpoint ``done`` items; ``read_after``: where a keyset read stands then.
        The spawns made for those items are stored with it (``workflows.spawns``)."""
        if total is not None:  # items added while the loop runs, where it cannot leave them out
            total = max(total, done)
        percent = 100 * done / total if total else None
        message = f"{done}/{total}" if total else f"{done} done"
        detail: dict[str, Any] = {READ_AFTER: read_after} if read_after is not None else {}
        if self._loop or LOOP in self._stored:  # (absent: 0, the first loop)
            detail[LOOP] = self._loop
        stored = None
        if self._iterated is not None and len(self.spawned) > self._iterated:
            new = self.spawned[self._iterated + self._saved :]  # only those made since the last one
            stored = spawns.Stored(done, self._saved, new, self._fresh)
        self._checkpoint(done, percent=percent, message=message, detail=detail, spawned=stored)
        if stored is not None:
            self._saved, self._fresh = stored.first + len(stored.new), False

    def _iterating(self, start: int, total: int | None) -> bool:
        """A loop begins at item ``start``; False: it is over nothing (``total`` 0), walks
        nothing and leaves the step's iteration to another loop. Otherwise it is the
        step's iteration, and the spawns an earlier attempt made for the items before
        ``start`` (stored with the checkpoint it resumes from) come back here. One per
        step run: the cursor counts the items of one iteration, so a second one would
        start at the first one's count and skip as many of its own items; so would a
        loop that resumes another one's checkpoint (``LOOP``: which loop stored it)."""
        loop, self._loops = self._loops, self._loops + 1
        if total == 0:
            return False
        refused = f"step '{self.step}' iterates once (ctx.iterate or ctx.batches): its cursor counts "
        if self._iterated is not None:
            raise NonRetryable(
                f"{refused}the items of loop {self._loop + 1}, "
                f"loop {loop + 1} would skip as many; split the step"
            )
        stored = self._stored.get(LOOP, 0) if start else loop
        if stored != loop:  # (the items of one of them changed since that checkpoint)
            raise NonRetryable(
                f"{refused}{start} items of loop {stored + 1}, loop {loop + 1} is the first with items "
                "now and would skip as many (a loop's items must be the same on every attempt)"
            )
        self._loop = loop
        self._iterated = len(self.spawned)
        back, self._saved = spawns.restored(self.job.pk, self.step, self._stored, start)
        self.spawned.extend(back)
        return True

    def iterate(self, items: Iterable[Any], every: int | None = None) -> Iterator[Any]:
        """Yield ``items`` from the step's cursor on, checkpointing the number of items
        done every ``every`` items (default: the step's ``batch``) and at the end.

        After a crash, items since the last checkpoint run again (at least once):
        keep per-item work idempotent, or use :meth:`batches` for database work.
        ``items`` must come in the same order on every attempt. A QuerySet (ordered) is
        counted with COUNT and read in chunks, never loaded whole (``workflows.items``).
        """
        every = self._every(every)
        start = done = self._index()
        rows, total = walk(items, start, every, self._read_after)
        if not self._iterating(start, total):
            return
        for item in rows:
            yield item
            done += 1
            if (done - start) % every == 0:
                self._done(done, total, position_of(rows))
        if done != start and self.cursor != done:
            self._done(done, total, position_of(rows))

    def batches(self, items: Iterable[Any], size: int | None = None) -> Iterator[Batch]:
        """Yield lists of ``size`` items from the cursor on. Used as ``with batch:``,
        the batch's database writes and its checkpoint commit together (exactly once
        for work in this database); otherwise the checkpoint follows each batch."""
        size = self._every(size)
        done = self._index()
        rows, total = walk(items, done, size, self._read_after)
        if not self._iterating(done, total):
            return
        it = iter(rows)
        while chunk := list(islice(it, size)):
            batch = Batch(self, chunk, done, total, position_of(rows))
            yield batch
            if not batch.committed:
                self._done(batch.end, total, batch.read_after)
            done = batch.end

    # Child jobs ----------------------------------------------------------------

    def spawn(self, kind: str, parameters: dict[str, Any] | None = None, **options: Any) -> None:
        """Ask for a child job (started, all together, once the step method returns;
        the workflow then waits for them without holding a worker). ``options``:
        priority, run_after, max_attempts."""
        self._active("spawn")
        # Checked here, as enqueue() will: a bad child is the step's own error, which
        # another attempt would only repeat, after running the body again. (A kind
        # not registered in this process is retried: another worker may have it.)
        unknown = set(options) - CHILD_OPTIONS
        if unknown:
            raise NonRetryable(f"spawn({kind!r}) got unknown options: {', '.join(sorted(unknown))}")
        try:
            child = services.checked_child(kind, parameters, **options)
        except UnknownKind:
            raise
        except ValidationError as invalid:
            raise NonRetryable(f"spawn({kind!r}): {_messages(invalid)}") from invalid
        self.spawned.append(ChildSpec(kind, cast(dict[str, Any], child.parameters), options, checked=child))

    def child_jobs(self, step: str | None = None) -> Any:
        """The children started by ``step`` (default: all this job's), in start order.
        A step copied into a retry lists the children of the job that ran it, and one
        that reused an earlier run's completed children lists those too."""
        if step is not None:
            qs = Job.objects.filter(pk__in=step_waits.children_of(self.job.pk, step))
        else:
            copied = JobStep.objects.filter(job_id=self.job.pk).filter(
                Q(detail__has_key="copied_from") | Q(detail__has_key=REUSED)
            )
            borrowed = [i for d in copied.values_list("detail", flat=True) for i in d.get("children", ())]
            qs = Job.objects.filter(Q(parent_id=self.job.pk) | Q(pk__in=borrowed))
        return qs.order_by("created_at", "id")

    # Service-style steps ------------------------------------------------------

    def serving(self, message: str = "serving") -> None:
        """Report that this step is up and serving (the step's status becomes
        ``serving`` and ``message`` shows on the job) until asked to stop."""
        self._active("serve")
        steps.serving(self.job, self.token, self.step, text(str(message)[:500]))

    def wait_for_stop(self, timeout: float | None = None, *, poll: float | None = None) -> bool:
        """Block until ``services.request_stop`` is called for this job (True) or
        ``timeout`` seconds pass (False). Raises ``CancelRequested`` on a cancel."""
        poll = float(poll or conf.get("WORKFLOW_POLL_SECONDS"))
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = self.job_context.stop_seen
        while True:
            stop_at, cancel_at = (
                Job.objects.filter(pk=self.job.pk)
                .values_list("stop_requested_at", "cancel_requested_at")
                .get()
            )
            if cancel_at is not None:
                self.job_context.cancel_seen.set()
                raise CancelRequested(self.job.pk)
            if stop_at is not None or seen.is_set():
                seen.set()
                return True
            wait = poll if deadline is None else min(poll, deadline - time.monotonic())
            if wait <= 0:
                return False
            seen.wait(wait)  # the heartbeat thread sets it as soon as it sees the request

    def mark_partial(self, message: str) -> None:
        """Let the workflow go on, but end it ``partial`` with ``message`` (kept across crashes)."""
        self._active("mark partial")
        steps.note(self.job, self.token, self.step, **{steps.PARTIAL: text(str(message)[:1000])})

    def _active(self, what: str) -> None:
        if self.undoing:
            raise RuntimeError(f"cannot {what} while undoing a step")


class Batch:
    """A list of items from :meth:`StepContext.batches`; ``with batch:`` makes its
    work and its checkpoint one transaction."""

    def __init__(
        self, ctx: StepContext, items: list[Any], start: int, total: int | None, read_after: Any = None
    ) -> None:
        self.ctx = ctx
        self.items = items
        self.start = start
        self.end = start + len(items)
        self.total = total
        self.read_after = read_after  # where the read stood after the batch's last item
        self.committed = False
        self._atomic: Any = None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __enter__(self) -> Batch:
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if et is None:
            try:
                self.ctx._done(self.end, self.total, self.read_after)
            except BaseException:
                self._atomic.__exit__(*sys.exc_info())
                raise
        result: bool | None = self._atomic.__exit__(et, ev, tb)
        self.committed = et is None
        return result


def _messages(invalid: ValidationError) -> str:
    if hasattr(invalid, "error_dict"):
        return "; ".join(f"{field}: {' '.join(m)}" for field, m in invalid.message_dict.items())
    return " ".join(invalid.messages)
