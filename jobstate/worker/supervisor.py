"""The heartbeat and watchdog of a worker process, and where interrupts land.

Each worker process has one **heartbeat** thread and one **watchdog** thread,
started once (not per job): the heartbeat does the database work (lease
renewal, cancel/stop/lease-loss detection, coalesced progress, the process's
``WorkerProcess`` row); the watchdog makes no database call, so nothing can
block it, and interrupts the handler (``Interrupted``, raised through
``INTERRUPT_SIGNAL`` in the handler's own frames only) on timeout, cancel grace
or lease loss. ``jobstate.worker.runner`` explains how an attempt ends.

A lease is also given up ``lease_margin()`` before it runs out (on this
process's clock, from the start of the last write that renewed it) while the
heartbeat cannot renew it: failing, or stuck in a call on a connection that no
longer answers (which may last minutes, the TCP timeout). From then on the
reaper may give the job to another worker, so the handler must be stopped by
then. A heartbeat that waits on a lock does not count: whoever holds the lock
(often the handler's own transaction) holds off the reaper too. On PostgreSQL
the heartbeat's lock waits end after half of ``HEARTBEAT_SECONDS`` (``SET LOCAL
lock_timeout``, in the heartbeat's own transaction, so that it never stays on a
pooled connection): a call in flight counts as a lock wait only if the one
before it ended in one, and then only until it has lasted twice
``HEARTBEAT_SECONDS``; on SQLite every wait is a lock wait on a file the reaper
shares. The reaper itself (PostgreSQL) leaves a job whose row a
transaction holds for its next sweep (``services.requeue_expired``), so that the
heartbeat can renew the lease once the handler's transaction ends. A heartbeat
stuck in such a call costs the job it renews; the next job this process begins
gets a new heartbeat thread (and connection), and the stuck one leaves when its
call returns.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from django.db import connection, transaction

from jobstate import conf, services
from jobstate.exceptions import CancelRequested, Interrupted, LeaseLost, waited_on_a_lock
from jobstate.registry import HandlerSpec
from jobstate.worker import clock, q2
from jobstate.worker.clock import ClockWatch
from jobstate.worker.context import JobContext
from jobstate.worker.outage import Outage

logger = logging.getLogger("jobstate")

INTERRUPT_SIGNAL = signal.SIGUSR1
# Longest the watchdog sleeps while a job runs (it also wakes at the deadline).
WATCH_SECONDS = 0.25


def lease_margin() -> float:
    """How long before its lease runs out (on this process's clock) the watchdog
    gives a job up when the heartbeat cannot renew it: the reaper may requeue it
    from then on, and the interrupt takes a moment to land."""
    return float(conf.get("HEARTBEAT_SECONDS")) / 2


def timeout_for(spec: HandlerSpec | None) -> float:
    return float(spec.timeout if spec is not None and spec.timeout else conf.get("DEFAULT_TIMEOUT"))


def hard_limit_for(spec: HandlerSpec | None) -> int:
    """Seconds after which django-q2 kills the worker process outright."""
    margin = float(conf.get("HARD_KILL_MARGIN_SECONDS"))
    return math.ceil(timeout_for(spec) + float(conf.get("CANCEL_GRACE_SECONDS")) + margin)


class Slot:
    """The job a worker process runs now, as its heartbeat and watchdog see it."""

    def __init__(self, ctx: JobContext, timeout: float, interruptible: bool) -> None:
        now = time.monotonic()
        self.ctx = ctx
        self.deadline = now + timeout
        self.interruptible = interruptible
        self.main_ident = threading.get_ident()
        self.next_beat = now + float(conf.get("HEARTBEAT_SECONDS"))
        self.done = threading.Event()  # the handler has returned (or raised)
        self.interrupted: str | None = None  # why the watchdog interrupts it
        self.delivered = False  # an Interrupted was raised inside the handler
        self.cancel_since: float | None = None
        self.call: HandlerCall | None = None
        # The heartbeat's last renewal waited on a lock instead of failing.
        self.blocked = False


class Supervisor:
    """The heartbeat and watchdog threads of one worker process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slot: Slot | None = None
        self.beat_wake = threading.Event()
        self.watch_wake = threading.Event()
        # (process name, cluster) once this process runs cluster jobs: it is then
        # recorded in WorkerProcess, busy or idle.
        self.identity: tuple[str, str] | None = None
        # Held by a process beat and by ``retire``: no beat writes the row again
        # once the process ended and removed it.
        self._beat_lock = threading.Lock()
        self._exit_hooked = False
        self.finished = 0
        self.renewed = 0  # job heartbeats since the last process beat
        # A database outage logs one traceback, then a line a minute (only under _beat_lock).
        self._beat_outage = Outage(logger, "jobstate worker heartbeat")
        # This process's clock against the database's, read by each process beat.
        self.clock = ClockWatch()
        # The same for the running job's lease renewals and progress writes (only
        # the heartbeat thread makes them); a run of failures spans jobs.
        self._job_outage = Outage(logger, "jobstate job heartbeat")
        self._flush_outage = Outage(logger, "jobstate progress")
        # Since when the heartbeat thread has been in its database work (None: idle).
        self.busy_since: float | None = None
        # PostgreSQL: the heartbeat's lock waits are bounded, so a call in flight
        # for long is a connection that no longer answers (module docstring).
        self.bounded_waits = connection.vendor == "postgresql"
        self._next_process_beat = 0.0
        self._generation = 0
        self.heart = self._start_heart()
        self.watch = threading.Thread(target=self._watchdog_loop, name="jobstate-watchdog", daemon=True)
        self.watch.start()

    def _start_heart(self) -> threading.Thread:
        """A heartbeat thread (with a database connection of its own, Django's being
        per thread); a new one retires the one before it."""
        self._generation += 1
        self.busy_since = None
        heart = threading.Thread(
            target=self._heartbeat_loop, args=(self._generation,), name="jobstate-heartbeat", daemon=True
        )
        heart.start()
        return heart

    def _heart_hung(self, now: float) -> bool:
        """Is the heartbeat stuck in a call on a connection that no longer answers
        (PostgreSQL, where its lock waits are bounded)?"""
        busy = self.busy_since
        return (
            self.bounded_waits and busy is not None and now - busy >= 2 * float(conf.get("HEARTBEAT_SECONDS"))
        )

    # -- what run_job calls ------------------------------------------------------

    def serve_as(self, name: str, cluster: str) -> None:
        if self.identity != (name, cluster):
            self.identity = (name, cluster)
            self.finished = 0
            self._next_process_beat = 0.0
            self.beat_wake.set()
        if not self._exit_hooked:
            self._exit_hooked = q2.at_clean_exit(self.retire)

    def retire(self) -> None:
        """The process ends cleanly (its django-q2 loop returned): no more process
        beats, and its WorkerProcess row goes, so that a stopped cluster does not
        show as alive, busy with the job it last ran, until WORKER_ALIVE_SECONDS
        pass. A beat under way is waited for (it would write the row again), for
        a heartbeat interval at most, and so is the removal (``at_exit``): after
        that the row is left to age."""
        from jobstate.services import workers

        if not self._beat_lock.acquire(timeout=float(conf.get("HEARTBEAT_SECONDS"))):
            logger.warning("jobstate: a process heartbeat is still under way; its row stays")
            return
        try:
            identity, self.identity = self.identity, None
        finally:
            self._beat_lock.release()
        if identity is None:
            return
        at_exit(workers.gone, identity[0], what="the row of process")

    def begin(self, slot: Slot) -> None:
        if self._heart_hung(time.monotonic()):
            # The job before lost its lease to it; this one gets a heartbeat that
            # works (this process just reached the database to begin it). The stuck
            # thread leaves once its call returns.
            logger.warning("jobstate heartbeat: stuck in a database call; a new heartbeat takes over")
            self.heart = self._start_heart()
        slot.ctx.on_pending = self.beat_wake.set
        self.slot = slot
        self.watch_wake.set()
        if self.identity is None:
            # Idle, it waits for this. A cluster worker's heartbeat wakes for its
            # next process beat, sooner than this job's first beat is due.
            self.beat_wake.set()

    def end(self, slot: Slot) -> None:
        slot.done.set()
        if self.slot is slot:
            self.slot = None
            if self.identity is not None:
                self.finished += 1
        # The watchdog sees ``done`` at its next look; the heartbeat of an inline
        # run (no identity) closes its idle connection.
        if self.identity is None:
            self.beat_wake.set()

    # -- the watchdog: no database call ------------------------------------------

    def _watchdog_loop(self) -> None:
        while True:
            self.watch_wake.clear()
            slot = self.slot
            if slot is None or slot.done.is_set():
                self.watch_wake.wait()
                continue
            try:
                wait = self._watch(slot)
            except Exception:  # never let the watchdog die
                logger.exception("jobstate watchdog")
                wait = WATCH_SECONDS
            self.watch_wake.wait(wait)

    def _watch(self, slot: Slot) -> float:
        now = time.monotonic()
        grace = float(conf.get("CANCEL_GRACE_SECONDS"))
        if slot.ctx.cancel_seen.is_set() and slot.cancel_since is None:
            slot.cancel_since = now
        # The heartbeat's state is read before the lease: a beat that succeeds in
        # between has moved the lease on by then (it renews, then reports).
        given_up = slot.ctx.lease_until - lease_margin()
        if not slot.ctx.lease_lost.is_set() and self._cut_off(slot, now) and now >= given_up:
            logger.warning(
                "Job %s: its lease runs out while the heartbeat cannot reach the database", slot.ctx.job.pk
            )
            slot.ctx.lease_lost.set()
        if slot.ctx.lease_lost.is_set():
            self.interrupt(slot, "lease")
        elif now >= slot.deadline:
            self.interrupt(slot, "timeout")
        elif slot.cancel_since is not None and now - slot.cancel_since >= grace:
            self.interrupt(slot, "cancel")
        if slot.interrupted is not None:
            return WATCH_SECONDS * 4
        until = slot.deadline - now
        if given_up > now:
            until = min(until, given_up - now)
        if slot.cancel_since is not None:
            until = min(until, slot.cancel_since + grace - now)
        return max(0.0, min(WATCH_SECONDS, until))

    def _cut_off(self, slot: Slot, now: float) -> bool:
        """Is the heartbeat unable to reach the database (not waiting on a lock)?

        A call in flight on PostgreSQL counts unless the one before it ended in a
        lock wait: it may be a connection that no longer answers, and until it
        returns nothing holds off the reaper. On SQLite every wait is a lock wait."""
        if self.busy_since is not None:
            if not self.bounded_waits:
                return False
            return not slot.blocked or self._heart_hung(now)
        return not slot.blocked

    def interrupt(self, slot: Slot, why: str) -> None:
        if slot.interrupted is not None or slot.done.is_set():
            return
        slot.interrupted = why
        logger.warning("Interrupting job %s: %s", slot.ctx.job.pk, why)
        if slot.interruptible:
            signal.pthread_kill(slot.main_ident, INTERRUPT_SIGNAL)

    # -- the heartbeat: database work -------------------------------------------

    def _heartbeat_loop(self, generation: int) -> None:
        while generation == self._generation:
            self.beat_wake.clear()
            self.busy_since = time.monotonic()
            try:
                wait = self._heartbeat(generation)
            except Exception:
                if generation != self._generation:
                    break
                logger.exception("jobstate heartbeat")
                close_quietly()
                wait = 1.0
            finally:
                if generation == self._generation:
                    self.busy_since = None
            self.beat_wake.wait(wait)
        close_quietly()  # retired: its connection is its own

    def _heartbeat(self, generation: int) -> float | None:
        interval = float(conf.get("HEARTBEAT_SECONDS"))
        now = time.monotonic()
        slot = self.slot
        wakes: list[float] = []
        if slot is not None and not slot.done.is_set():
            if now >= slot.next_beat:
                slot.next_beat = now + interval
                if not slot.ctx.lease_lost.is_set():  # lost is lost: no query, no warning, every beat
                    self._beat_job(slot)
                if generation != self._generation:
                    return None  # retired while stuck in that call: its successor beats now
            due = slot.ctx.progress_due(now)
            if due is not None and now >= due:
                self._flush(slot)
                due = slot.ctx.progress_due(time.monotonic())
            wakes.append(slot.next_beat)
            if due is not None:
                wakes.append(due)
        if self.identity is not None:
            if now >= self._next_process_beat:
                self._next_process_beat = now + interval
                self._beat_process(slot)
            wakes.append(self._next_process_beat)
        elif slot is None and connection.connection is not None:
            close_quietly()  # inline runs (tests, scripts): hold no idle connection
        if not wakes:
            return None
        return max(0.0, min(wakes) - time.monotonic())

    @contextlib.contextmanager
    def _bounded_waits(self) -> Iterator[None]:
        """On PostgreSQL, run the block in a transaction whose lock waits end after
        half of HEARTBEAT_SECONDS, and which the server ends if this process stops
        between two of its statements for half of LEASE_SECONDS (a process frozen
        there, say by SIGSTOP or a paused machine, would hold the job's row, and the
        reaper, which leaves held rows for its next sweep, would never take the job
        back). ``SET LOCAL``: nothing stays on the connection."""
        if not self.bounded_waits:
            yield
            return
        ms = max(1, round(float(conf.get("HEARTBEAT_SECONDS")) * 500))
        idle = max(1, round(float(conf.get("LEASE_SECONDS")) * 500))
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true),"
                    " set_config('idle_in_transaction_session_timeout', %s, true)",
                    [f"{ms}ms", f"{idle}ms"],
                )
            yield

    def _beat_job(self, slot: Slot) -> None:
        ctx = slot.ctx
        since = time.monotonic()
        try:
            with self._bounded_waits():
                beat = services.heartbeat(ctx.job, ctx.token)
        except LeaseLost:
            # Logged here too: the handler may end on the flag before the watchdog
            # interrupts it, and then nothing else would say why.
            logger.warning("Heartbeat of job %s refused: lease lost", ctx.job.pk)
            self._job_outage.ended()  # refused: the database answered
            ctx.lease_lost.set()
            self.watch_wake.set()
            return
        except Exception as exc:  # a lock wait: again at once; a failure: at the next beat
            slot.blocked = waited_on_a_lock(exc)
            if slot.blocked:
                # At once, and so on while the lock is held: waiting in the row's
                # queue, the heartbeat gets it before the reaper once it is released.
                slot.next_beat = time.monotonic()
                logger.info("Heartbeat of job %s waited on a lock; trying again", ctx.job.pk)
            else:
                self._job_outage.failed(
                    f"Heartbeat failed for job {ctx.job.pk}; trying again at each beat", exc
                )
                close_quietly()
            return
        self._job_outage.ended()
        ctx.renewed(since)  # before ``blocked`` is cleared: see _watch
        slot.blocked = False
        self.renewed += 1
        if beat.cancel_requested:
            ctx.cancel_seen.set()
            self.watch_wake.set()
        if beat.stop_requested:
            ctx.stop_seen.set()

    def _flush(self, slot: Slot) -> None:
        try:
            with self._bounded_waits():
                slot.ctx.flush_progress()
        except (CancelRequested, LeaseLost):  # refused: the database answered
            self.watch_wake.set()
        except Exception as exc:  # the report is kept for the next try (flush_progress)
            if waited_on_a_lock(exc):
                logger.info("Progress of job %s waited on a lock; trying again", slot.ctx.job.pk)
            else:
                message = f"Progress of job {slot.ctx.job.pk} could not be written; kept for the next try"
                self._flush_outage.failed(message, exc)
                close_quietly()
            return
        self._flush_outage.ended()

    def _beat_process(self, slot: Slot | None) -> None:
        # Not waited for: the holder may be a heartbeat stuck in this call on a
        # connection that no longer answers, and this one must go on renewing
        # the job's lease. The beat is skipped (its counts kept for the next).
        if not self._beat_lock.acquire(blocking=False):
            return
        try:
            if self.identity is not None:  # else retired since the heartbeat looked
                self._beat_process_as(slot, *self.identity)
        finally:
            self._beat_lock.release()

    def _beat_process_as(self, slot: Slot | None, name: str, cluster: str) -> None:
        from jobstate.services import workers

        finished, self.finished = self.finished, 0
        renewed, self.renewed = self.renewed, 0
        try:
            before = clock.wall()
            database_now = workers.beat(
                name,
                cluster=cluster,
                role="worker",
                job_id=slot.ctx.job.pk if slot is not None and not slot.done.is_set() else None,
                finished=finished,
                renewed=renewed,
                clock_offset=self.clock.offset,
            )
            self.clock.measured(before, database_now, clock.wall(), name)
        except Exception as exc:
            self.finished += finished
            self.renewed += renewed
            self._beat_outage.failed(f"failed for {name}; trying again at each beat", exc)
            close_quietly()
            return
        self._beat_outage.ended()


_supervisor: Supervisor | None = None
_supervisor_lock = threading.Lock()


def supervisor() -> Supervisor:
    """This process's heartbeat and watchdog (started on first use, again after a fork)."""
    global _supervisor
    current = _supervisor
    if current is not None and current.pid == os.getpid():
        return current
    with _supervisor_lock:
        if _supervisor is None or _supervisor.pid != os.getpid():
            _supervisor = Supervisor()
        return _supervisor


def close_quietly() -> None:
    with contextlib.suppress(Exception):
        connection.close()


def at_exit(remove: Callable[[str], None], name: str, *, what: str) -> None:
    """A clean exit's database call (``remove(name)``), waited for a heartbeat
    interval at most: on a database that no longer answers (a network that drops
    packets) it would wait for the TCP timeout, minutes, and the graceful stop
    with it. It runs in a thread of its own (with its own connection, closed
    after); one still waiting is left behind as the process exits, the row to age."""

    def run() -> None:
        try:
            remove(name)
        except Exception:
            logger.warning("jobstate: could not remove %s %s", what, name, exc_info=True)
        finally:
            close_quietly()

    call = threading.Thread(target=run, name="jobstate-exit", daemon=True)
    call.start()
    call.join(float(conf.get("HEARTBEAT_SECONDS")))
    if call.is_alive():
        logger.warning("jobstate: the database did not answer in time; %s %s stays", what, name)


class HandlerCall:
    """Calls the handler. Its frame marks where interrupts may land: only in
    frames it called (the handler and what the handler calls). Once the handler
    has returned, control is back in this frame or above, and a late interrupt
    is ignored instead of discarding the handler's result."""

    def __init__(self, func: Any, slot: Slot) -> None:
        self.func = func
        self.slot = slot
        self.entered = False

    def __call__(self, ctx: JobContext) -> Any:
        self.entered = True
        # An interrupt that came before this frame was ignored: honour it now.
        if self.slot.interrupted is not None:
            self.slot.delivered = True
            raise Interrupted(self.slot.interrupted)
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


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    """The INTERRUPT_SIGNAL handler, installed once per process (main thread)."""
    current = _supervisor
    slot = current.slot if current is not None and current.pid == os.getpid() else None
    if slot is None or slot.interrupted is None or slot.done.is_set() or slot.call is None:
        return
    if slot.call.in_handler(frame):
        slot.delivered = True
        raise Interrupted(slot.interrupted)


def install_signal() -> None:
    if signal.getsignal(INTERRUPT_SIGNAL) is not _on_interrupt:
        signal.signal(INTERRUPT_SIGNAL, _on_interrupt)
