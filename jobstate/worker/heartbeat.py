"""The heartbeat of a worker process: all of its database work (lease renewal,
cancel/stop/lease-loss detection, coalesced progress, the process's
``WorkerProcess`` row), on a thread and connection of its own. Its lock waits
are bounded on PostgreSQL (``jobstate.worker.watchdog`` explains why, and how
the watchdog judges a heartbeat that cannot renew a lease)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from django.db import connection, transaction

from jobstate import conf, services
from jobstate.exceptions import CancelRequested, LeaseLost, waited_on_a_lock
from jobstate.worker import clock
from jobstate.worker.clock import ClockWatch
from jobstate.worker.connections import close_quietly
from jobstate.worker.outage import Outage
from jobstate.worker.slot import Slot

logger = logging.getLogger("jobstate")


class Heartbeat:
    """The heartbeat thread's part of ``Supervisor``."""

    slot: Slot | None
    beat_wake: threading.Event
    watch_wake: threading.Event
    identity: tuple[str, str] | None
    busy_since: float | None
    bounded_waits: bool
    finished: int
    renewed: int
    clock: ClockWatch
    _beat_lock: threading.Lock
    _beat_outage: Outage
    _job_outage: Outage
    _flush_outage: Outage
    _next_process_beat: float
    _generation: int

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
        if slot is not None and not slot.done.is_set() and not slot.given_up:
            # A handler given up (jobstate.worker.escalation) is left alone: its lease
            # runs out unless its outcome was recorded.
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
        ctx.renewed(since)  # before ``blocked`` is cleared: see Watchdog._watch
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
