"""The heartbeat and watchdog of a worker process, and where interrupts land.

Each worker process has one **heartbeat** thread and one **watchdog** thread,
started once (not per job): the heartbeat does the database work (lease
renewal, cancel/stop/lease-loss detection, coalesced progress, the process's
``WorkerProcess`` row; ``jobstate.worker.heartbeat``); the watchdog makes no
database call, so nothing can block it, and interrupts the handler
(``Interrupted``, raised through ``INTERRUPT_SIGNAL`` in the handler's own
frames only) on timeout, cancel grace or lease loss
(``jobstate.worker.watchdog``, which also explains when a lease the heartbeat
cannot renew is given up). ``jobstate.worker.runner`` explains how an attempt
ends.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

from django.db import connection

from jobstate import conf
from jobstate.exceptions import Interrupted
from jobstate.worker import q2
from jobstate.worker.clock import ClockWatch
from jobstate.worker.connections import at_exit
from jobstate.worker.heartbeat import Heartbeat
from jobstate.worker.outage import Outage
from jobstate.worker.slot import INTERRUPT_SIGNAL, Slot
from jobstate.worker.watchdog import Watchdog

logger = logging.getLogger("jobstate")


class Supervisor(Heartbeat, Watchdog):
    """The heartbeat and watchdog threads of one worker process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slot = None
        self.beat_wake = threading.Event()
        self.watch_wake = threading.Event()
        # (process name, cluster) once this process runs cluster jobs: it is then
        # recorded in WorkerProcess, busy or idle.
        self.identity = None
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
        self.busy_since = None
        # PostgreSQL: the heartbeat's lock waits are bounded, so a call in flight
        # for long is a connection that no longer answers (jobstate.worker.watchdog).
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
        with slot.ending:  # not while the escalation decides (jobstate.worker.escalation)
            slot.done.set()
        if self.slot is slot:
            self.slot = None
            if self.identity is not None:
                self.finished += 1
        # The watchdog sees ``done`` at its next look; the heartbeat of an inline
        # run (no identity) closes its idle connection.
        if self.identity is None:
            self.beat_wake.set()


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
