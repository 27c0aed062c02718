"""How many jobs the broker's pusher claims, and when (``Room``).

Claims are sized to demand: one claim (one round trip) takes as many jobs as
the cluster has room for (``prefetch``: free worker slots plus a short
prefetch), and a busy pusher waits on a shared-memory counter, without
touching the database, until a worthwhile batch fits.
"""

from __future__ import annotations

import time

from jobstate import conf
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker import counters, q2
from jobstate.worker.cluster import cluster_id

# How often a pusher with no worthwhile room looks at the shared counter again,
# and how long it waits so at most before returning to django-q2 (seconds).
FULL_WAIT = 0.005
FULL_WAIT_MAX = 0.1


class Room:
    """``JobBroker``'s sizing of its claims to the room in django-q2's queue."""

    _next_reconcile: float
    _next_forget: float

    def _reset_room(self) -> None:
        self._next_reconcile = self._next_forget = 0.0

    def _worthwhile(self, room: int, limit: int) -> bool:
        """Claim now only if a worker may soon run dry (no more waiting packages
        than worker processes) or at least half the prefetch fits: one batch of
        several jobs instead of a claim each time a slot frees up."""
        if counters.pending is None or not counters.pending.shared:
            return True
        return counters.pending.get() <= q2.workers() or 2 * room >= limit

    def _wait_for_room(self, limit: int) -> None:
        """Wait, without touching the database, until a claim is worthwhile (or
        ``FULL_WAIT_MAX`` passes, so django-q2 can stop the pusher)."""
        deadline = time.monotonic() + FULL_WAIT_MAX
        while True:
            time.sleep(FULL_WAIT)
            if time.monotonic() >= deadline or counters.pending is None or not counters.pending.shared:
                return
            room = limit - counters.pending.get()
            if room > 0 and self._worthwhile(room, limit):
                return

    def prefetch(self, now: float) -> int:
        """How many claimed jobs may wait for a worker process: ``PREFETCH`` if set,
        else one per idle worker process. A busy worker process claims its next
        job itself as it ends one (``jobstate.worker.tasks.execute``), so the
        pusher reserves nothing for it: jobs stay claimable by any cluster until
        a process is free to begin them. Never more than django-q2's
        ``queue_limit``: a full queue would block the pusher, and with it the
        renewal of the leases of waiting jobs."""
        fixed = conf.get("PREFETCH")
        wanted = int(fixed) if fixed else self._idle_workers(now)
        limit = q2.queue_limit()
        return min(wanted, limit) if limit > 0 else wanted

    def _idle_workers(self, now: float) -> int:
        workers = q2.workers()
        busy = counters.busy
        if busy is None or not busy.shared:
            return workers
        idle = workers - busy.count()
        if idle <= 0 and now >= self._next_forget:
            # A worker process killed inside ``execute`` never left its slot.
            self._next_forget = now + 1.0
            busy.forget_dead()
            idle = workers - busy.count()
        return max(0, idle)

    def _room(self, now: float, limit: int) -> int:
        if counters.pending is None or not counters.pending.shared:
            return limit
        room = limit - counters.pending.get()
        if room <= 0:
            self._reconcile(now)
            room = limit - counters.pending.get()
        return room

    def _free(self, now: float) -> int:
        """Places left in django-q2's bounded in-memory queue (jobs and plain tasks)."""
        limit = q2.queue_limit()
        if limit <= 0 or counters.pending is None or not counters.pending.shared or counters.plain is None:
            return limit if limit > 0 else 1 << 30
        free = limit - counters.pending.get() - counters.plain.get()
        if free <= 0:
            self._reconcile(now)
            free = limit - counters.pending.get() - counters.plain.get()
        return free

    def _reconcile(self, now: float) -> None:
        """A pusher that died between taking work and handing it over, or a worker
        process that died right after taking a package, leaves a counter too high;
        the database bounds the real numbers."""
        if now < self._next_reconcile or counters.pending is None or counters.plain is None:
            return
        self._next_reconcile = now + max(q2.poll(), 1.0)
        waiting = Job.objects.filter(status=Status.PROCESSING, worker_id=cluster_id()[:200]).count()
        counters.pending.lower_to(waiting)
        counters.plain.lower_to(q2.plain_locked(self))
