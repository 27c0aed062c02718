"""The watchdog of a worker process: it makes no database call, so nothing can
block it, and interrupts the handler (``Interrupted``, raised through
``INTERRUPT_SIGNAL`` in the handler's own frames only) on timeout, cancel grace
or lease loss. A handler that has not honoured its interrupt
``INTERRUPT_GRACE_SECONDS`` later is given up (``jobstate.worker.escalation``).

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

import logging
import signal
import threading
import time

from jobstate import conf
from jobstate.worker import escalation
from jobstate.worker.limits import lease_margin
from jobstate.worker.slot import INTERRUPT_SIGNAL, Slot

logger = logging.getLogger("jobstate")

# Longest the watchdog sleeps while a job runs (it also wakes at the deadline).
WATCH_SECONDS = 0.25


class Watchdog:
    """The watchdog thread's part of ``Supervisor``."""

    slot: Slot | None
    watch_wake: threading.Event
    # Since when the heartbeat thread has been in its database work (None: idle).
    busy_since: float | None
    # PostgreSQL: the heartbeat's lock waits are bounded (module docstring).
    bounded_waits: bool

    def _heart_hung(self, now: float) -> bool:
        """Is the heartbeat stuck in a call on a connection that no longer answers
        (PostgreSQL, where its lock waits are bounded)?"""
        busy = self.busy_since
        return (
            self.bounded_waits and busy is not None and now - busy >= 2 * float(conf.get("HEARTBEAT_SECONDS"))
        )

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
                "Job %s: its lease runs out and the heartbeat could not renew it (the database "
                "unreachable, or this process paused)",
                slot.ctx.job.pk,
            )
            slot.ctx.lease_lost.set()
        if slot.ctx.lease_lost.is_set():
            self.interrupt(slot, "lease")
        elif now >= slot.deadline:
            self.interrupt(slot, "timeout")
        elif (
            slot.cancel_since is not None
            and self._cancel_grace_runs(slot)
            and now - slot.cancel_since >= grace
        ):
            self.interrupt(slot, "cancel")
        if slot.interrupted is not None:
            if slot.interrupted_at is None:
                return WATCH_SECONDS * 4
            # Not honoured in time: given up (jobstate.worker.escalation).
            left = slot.interrupted_at + escalation.grace() - now
            if left <= 0:
                escalation.give_up(slot)
                return WATCH_SECONDS * 4
            return min(WATCH_SECONDS * 4, left)
        until = slot.deadline - now
        if given_up > now:
            until = min(until, given_up - now)
        if slot.cancel_since is not None and self._cancel_grace_runs(slot):
            until = min(until, slot.cancel_since + grace - now)
        return max(0.0, min(WATCH_SECONDS, until))

    @staticmethod
    def _cancel_grace_runs(slot: Slot) -> bool:
        """Is the cancel grace period counting? Not while a workflow runs its undos
        (a failure's compensation, which a cancel does not stop, or a cancel's with
        ``undo_on_cancel``, which is how it honours it): the job's timeout bounds them."""
        return slot.cancel_since is not None and not slot.ctx.compensating.is_set()

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
        slot.interrupted, slot.interrupted_at = why, time.monotonic()
        logger.warning("Interrupting job %s: %s", slot.ctx.job.pk, why)
        if slot.interruptible:
            signal.pthread_kill(slot.main_ident, INTERRUPT_SIGNAL)
