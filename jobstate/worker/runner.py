"""Run one claimed job to its outcome, with a background heartbeat.

The handler runs in the calling thread. A heartbeat thread renews the lease,
notices cancel and stop requests, and, from the main thread's point of view,
interrupts the handler (a ``BaseException`` raised through a signal, so a
handler's ``except Exception`` cannot swallow it) when it overruns its timeout,
ignores a cancel past the grace period, or loses its lease. An interrupt that
lands once the handler has returned is ignored: its outcome stands.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
import traceback as tb
from types import FrameType
from typing import Any

from django.db import connection, transaction

from jobstate import conf, registry, services
from jobstate.exceptions import (
    CancelRequested,
    InvalidTransition,
    LeaseLost,
    NonRetryable,
    Partial,
    Suspend,
)
from jobstate.models import Job
from jobstate.registry import HandlerSpec
from jobstate.worker.context import JobContext

logger = logging.getLogger("jobstate")

INTERRUPT_SIGNAL = signal.SIGUSR1


class Interrupted(BaseException):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def timeout_for(spec: HandlerSpec | None) -> float:
    return float(spec.timeout if spec is not None and spec.timeout else conf.get("DEFAULT_TIMEOUT"))


def hard_limit_for(spec: HandlerSpec | None) -> int:
    """Seconds after which django-q2 kills the worker process outright."""
    margin = float(conf.get("HARD_KILL_MARGIN_SECONDS"))
    return math.ceil(timeout_for(spec) + float(conf.get("CANCEL_GRACE_SECONDS")) + margin)


class Heartbeat(threading.Thread):
    def __init__(self, ctx: JobContext, timeout: float, interruptible: bool) -> None:
        super().__init__(name=f"jobstate-heartbeat-{ctx.job.pk}", daemon=True)
        self.ctx = ctx
        self.deadline = time.monotonic() + timeout
        self.interruptible = interruptible
        self.main_ident = threading.get_ident()
        self.done = threading.Event()
        self.interrupted: str | None = None
        self._cancel_since: float | None = None

    def run(self) -> None:
        interval = float(conf.get("HEARTBEAT_SECONDS"))
        grace = float(conf.get("CANCEL_GRACE_SECONDS"))
        next_beat = time.monotonic() + interval
        try:
            while not self.done.wait(min(0.25, interval)):
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + interval
                    self._beat()
                if self.ctx.cancel_seen.is_set() and self._cancel_since is None:
                    self._cancel_since = now
                if now >= self.deadline:
                    self._interrupt("timeout")
                elif self._cancel_since is not None and now - self._cancel_since >= grace:
                    self._interrupt("cancel")
        finally:
            connection.close()

    def _beat(self) -> None:
        try:
            beat = services.heartbeat(self.ctx.job, self.ctx.token)
        except LeaseLost:
            self._interrupt("lease")
            return
        except Exception:  # a database hiccup: try again at the next beat
            logger.exception("Heartbeat failed for job %s", self.ctx.job.pk)
            return
        if beat.cancel_requested:
            self.ctx.cancel_seen.set()
        if beat.stop_requested:
            self.ctx.stop_seen.set()

    def _interrupt(self, why: str) -> None:
        if self.interrupted is not None or self.done.is_set():
            return
        self.interrupted = why
        logger.warning("Interrupting job %s: %s", self.ctx.job.pk, why)
        if self.interruptible:
            signal.pthread_kill(self.main_ident, INTERRUPT_SIGNAL)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


class HandlerCall:
    """Calls the handler. Its frame marks where interrupts may land: only in
    frames it called (the handler and what the handler calls). Once the handler
    has returned, control is back in this frame or above, and a late interrupt
    is ignored instead of discarding the handler's result."""

    def __init__(self, func: Any, beat: Heartbeat) -> None:
        self.func = func
        self.beat = beat
        self.entered = False

    def __call__(self, ctx: JobContext) -> Any:
        self.entered = True
        # An interrupt that came before this frame was ignored: honour it now.
        if self.beat.interrupted is not None:
            raise Interrupted(self.beat.interrupted)
        return self.func(ctx)

    def in_handler(self, frame: FrameType | None) -> bool:
        """Is ``frame`` (where a signal landed) inside the handler?"""
        depth = 0
        while frame is not None:
            if frame.f_code is _CALL_CODE:
                # In this frame itself the handler has either not been called
                # yet (interrupting is fine) or has returned (too late).
                return depth > 0 or not self.entered
            frame, depth = frame.f_back, depth + 1
        return False


_CALL_CODE = HandlerCall.__call__.__code__


def run_job(job: Job, worker_id: str) -> str:
    """Run a job this worker has claimed; return its outcome
    (completed, partial, failed, retrying, cancelled, suspended, lost)."""
    spec = registry.all_handlers().get(job.kind)
    if spec is None:
        services.fail(
            job,
            job.lease_token,
            f"No handler registered for kind '{job.kind}'",
            error_type="UnknownKind",
            retry=False,
        )
        return "failed"
    interruptible = threading.current_thread() is threading.main_thread()
    previous: Any = None
    installed = False
    try:
        ctx = JobContext(job, spec, worker_id)
        beat = Heartbeat(ctx, timeout_for(spec), interruptible)
        call = HandlerCall(spec.func, beat)
        if interruptible:
            previous = signal.signal(INTERRUPT_SIGNAL, _raise_interrupt(call))
            installed = True
        beat.start()
    except Exception as exc:
        if installed:
            signal.signal(INTERRUPT_SIGNAL, previous or signal.SIG_DFL)
        release(job, exc, "the handler could not be started")
        raise
    started = time.monotonic()
    outcome: tuple[str, Any]
    try:
        try:
            outcome = ("ok", call(ctx))
        finally:
            beat.stop()
    except Interrupted as exc:
        outcome = ("interrupted", exc.why)
    except Exception as exc:
        outcome = ("error", exc)
    finally:
        if interruptible:
            signal.signal(INTERRUPT_SIGNAL, previous or signal.SIG_DFL)
    _usable_connection(time.monotonic() - started)
    return _finish(ctx, *outcome)


def _usable_connection(handler_seconds: float) -> None:
    """Make sure the outcome can be stored: replace this thread's connection if
    the handler broke it (or, after a long run, if the server dropped it).
    Not unconditionally: with CONN_MAX_AGE=0 that would reconnect for every job."""
    if connection.connection is None or connection.in_atomic_block:
        return
    if connection.errors_occurred or handler_seconds > 30:
        if not connection.is_usable():
            connection.close()
        connection.errors_occurred = False


def _raise_interrupt(call: HandlerCall) -> Any:
    beat = call.beat

    def handler(signum: int, frame: FrameType | None) -> None:
        if beat.interrupted and not beat.done.is_set() and call.in_handler(frame):
            raise Interrupted(beat.interrupted)

    return handler


def end_attempt(
    job: Job,
    token: Any,
    error: str,
    *,
    error_type: str,
    traceback: str = "",
    retry: bool = True,
    retry_delay: float | None = None,
) -> str:
    """End an attempt that failed or was interrupted: ``cancelled`` if a cancel
    was requested (a retry would be cancelled anyway, and the last attempt must
    not end ``failed``), else ``services.fail``. Returns the outcome."""
    with transaction.atomic():
        # The row lock keeps a cancel request from landing between the two.
        requested = (
            Job.objects.select_for_update()
            .filter(pk=job.pk)
            .values_list("cancel_requested_at", flat=True)
            .first()
        )
        if requested is not None:
            logger.info("Job %s: cancel requested; attempt ended with %s: %s", job.pk, error_type, error)
            reason = f"cancel requested; the attempt ended with {error_type}: {error}"
            services.cancel_now(job, token, reason=reason[:1000])
            return "cancelled"
        services.fail(
            job,
            token,
            error,
            error_type=error_type,
            traceback=traceback,
            retry=retry,
            retry_delay=retry_delay,
        )
    return "retrying" if Job.objects.filter(pk=job.pk, status="queued").exists() else "failed"


def release(job: Job, exc: BaseException, why: str) -> str:
    """Hand back a job whose handler never started (say, the database failed):
    requeued or failed through the service layer, or cancelled if that was
    requested. If even that fails, the lease runs out into the reaper."""
    _usable_connection(math.inf)
    try:
        return end_attempt(
            job,
            job.lease_token,
            f"{why}: {exc}"[:1000],
            error_type=type(exc).__name__,
            traceback="".join(tb.format_exception(exc)),
        )
    except (LeaseLost, InvalidTransition):
        return "lost"
    except Exception:
        logger.exception("Job %s could not be released; the reaper will take it", job.pk)
        return "lost"


def _finish(ctx: JobContext, kind: str, value: Any) -> str:
    job, token = ctx.job, ctx.token
    try:
        if kind == "ok":
            services.complete(job, token, value)
            return "completed"
        if kind == "interrupted":
            if value == "lease":
                return "lost"
            if value == "cancel":
                services.cancel_now(job, token, reason="stopped after the cancel grace period")
                return "cancelled"
            return end_attempt(
                job,
                token,
                f"Timed out after {timeout_for(ctx.spec):g} s",
                error_type="Timeout",
                retry_delay=_delay(ctx),
            )
        exc: Exception = value
        if isinstance(exc, CancelRequested):
            services.cancel_now(job, token)
            return "cancelled"
        if isinstance(exc, LeaseLost):
            logger.warning("Job %s: lease lost, result discarded", job.pk)
            return "lost"
        if isinstance(exc, Suspend):
            services.suspend(job, token, until=exc.until, reason=exc.reason)  # type: ignore[arg-type]
            return "suspended"
        if isinstance(exc, Partial):
            services.mark_partial(job, token, exc.result, str(exc))
            return "partial"
        return end_attempt(
            job,
            token,
            str(exc) or type(exc).__name__,
            error_type=type(exc).__name__,
            traceback="".join(tb.format_exception(exc)),
            retry=not isinstance(exc, NonRetryable),
            retry_delay=_delay(ctx),
        )
    except LeaseLost:
        logger.warning("Job %s: lease lost before its outcome was stored", job.pk)
        return "lost"


def _delay(ctx: JobContext) -> float:
    from jobstate.retry import backoff_seconds

    return backoff_seconds(ctx.attempt, ctx.spec)


def run_next(worker_id: str, kinds: list[str] | None = None) -> Job | None:
    """Claim one ready job and run it inline. Returns the job, or None if none was ready."""
    claimed = services.claim(worker_id, kinds=kinds, limit=1)
    if not claimed:
        return None
    run_job(claimed[0], worker_id)
    return claimed[0]


def drain(worker_id: str = "inline", kinds: list[str] | None = None, max_jobs: int = 1000) -> int:
    """Run ready jobs inline until none is ready (tests, scripts). Returns how many ran."""
    count = 0
    while count < max_jobs and run_next(worker_id, kinds) is not None:
        count += 1
    return count
