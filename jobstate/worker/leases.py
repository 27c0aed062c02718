"""The broker's pusher's care of leases (``Leases``): it renews those of the jobs
it handed to django-q2 that still wait for a worker process (and its own
WorkerProcess heartbeat), and runs the reaper, which requeues the jobs whose
leases expired."""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from typing import Any, NamedTuple

from django.db import DatabaseError, connection

from jobstate import conf, registry, services
from jobstate.services import workers as worker_processes
from jobstate.worker import clock, counters, q2
from jobstate.worker.clock import ClockWatch
from jobstate.worker.cluster import cluster_id
from jobstate.worker.connections import at_exit
from jobstate.worker.packages import task_timeout

logger = logging.getLogger("jobstate.worker")

# Lease periods, past the longest hard limit, that a job may wait in django-q2's
# queue while no worker process takes anything before its lease is left to expire.
STALL_LEASES = 3


class Handed(NamedTuple):
    """A job handed to django-q2: its id, its claim's lease token, and when (monotonic)."""

    pk: Any
    token: Any
    at: float


def _pusher_gone(name: str) -> None:
    """The pusher ends cleanly (the cluster stops): its WorkerProcess row goes
    (waited for a heartbeat interval at most: ``connections.at_exit``)."""
    at_exit(worker_processes.gone, name, what="the pusher's row")


class Leases:
    """``JobBroker``'s renewal of the leases of the jobs it handed out, and its reaper."""

    _exit_hooked: int  # the pid whose pusher row is removed at its clean exit
    _clock: ClockWatch  # the pusher's clock (it claims, and renews leases)
    _next_reap: float
    _next_renew: float
    _renewed: int
    _handed: int
    _plain_handed: int
    _taken: int
    _last_pickup: float
    # Jobs handed to django-q2, oldest first; the last ``counters.pending`` of them
    # are still waiting for a worker process.
    _waiting: deque[Handed]

    def _reset_leases(self) -> None:
        self._next_reap = self._next_renew = 0.0
        self._handed = self._plain_handed = self._taken = self._renewed = 0
        self._last_pickup = 0.0
        self._waiting = deque()

    def _reap(self, now: float) -> None:
        interval = float(conf.get("REAP_INTERVAL_SECONDS") or 0)
        self._next_reap = now + (interval if interval > 0 else float("inf"))
        if interval <= 0:
            return
        report = services.requeue_expired()
        if report.total:
            outcomes = {"requeued": report.requeued, "failed": report.failed, "cancelled": report.cancelled}
            logger.warning(
                "jobstate reaper: requeued %d, failed %d, cancelled %d job(s) whose worker was lost (%s)%s",
                len(report.requeued),
                len(report.failed),
                len(report.cancelled),
                "; ".join(f"{label} {listed(ids)}" for label, ids in outcomes.items() if ids),
                "; more remain past the sweep's limit, swept again next" * report.more,
            )
        if report.more:
            # A mass loss (a cluster killed) would otherwise wait an interval per 500 jobs.
            self._next_reap = now

    def _renew(self, now: float) -> None:
        """Keep the leases of jobs waiting in django-q2's in-memory queue: a job
        queued behind a long one must not be rescued before it has even
        started. Only those: a job a worker process took (and maybe died with
        before beginning it) is left to the reaper. Also the pusher's own
        WorkerProcess heartbeat."""
        self._next_renew = now + float(conf.get("HEARTBEAT_SECONDS"))
        name = f"{cluster_id()}:{os.getpid()}"
        try:
            before = clock.wall()
            database_now = worker_processes.beat(
                name,
                cluster=cluster_id(),
                role="pusher",
                renewed=self._renewed,
                clock_offset=self._clock.offset,
            )
            self._clock.measured(before, database_now, clock.wall(), name)
            self._renewed = 0
            if self._exit_hooked != os.getpid() and q2.at_clean_exit(functools.partial(_pusher_gone, name)):
                self._exit_hooked = os.getpid()
        except DatabaseError:
            if connection.connection is None or not connection.is_usable():
                raise  # out of reach: dequeue's database error (logged once in a row)
            logger.warning("jobstate broker: could not record the pusher's heartbeat", exc_info=True)
        waiting = self._still_waiting(now)
        if waiting:
            self._renewed += services.extend_leases(cluster_id(), [(w.pk, w.token) for w in waiting])

    def _still_waiting(self, now: float) -> list[Handed]:
        """The jobs handed out that no worker process has taken yet.

        django-q2's queue is FIFO and a worker counts a job off as soon as it
        takes it, so the jobs still waiting are the last ``counters.pending`` handed
        out. Should a worker die between taking a package and counting it off,
        the count stays one too high and that job looks waiting: it stops being
        renewed at the next pick-up, or once no worker process has taken
        anything for longer than any task may run (``max_wait``).
        """
        if counters.pending is not None and counters.pending.shared and counters.plain is not None:
            waiting = counters.pending.get()
            while len(self._waiting) > waiting:
                self._waiting.popleft()
            taken = self._handed - waiting + self._plain_handed - counters.plain.get()
            if taken != self._taken:
                self._taken, self._last_pickup = taken, now
        limit = max_wait()
        while self._waiting and now - max(self._waiting[0].at, self._last_pickup) >= limit:
            self._waiting.popleft()
        return list(self._waiting)


# Job ids a reaper's log line names per outcome.
LOGGED_IDS = 10


def listed(ids: list[Any]) -> str:
    """The first ``LOGGED_IDS`` of ``ids``, then ``and N more``: an operator can follow them."""
    more = len(ids) - LOGGED_IDS
    return ", ".join(str(pk) for pk in ids[:LOGGED_IDS]) + (f" and {more} more" if more > 0 else "")


def max_wait() -> float:
    """Seconds a job may wait in django-q2's queue while no worker process takes
    anything: every busy worker frees up within the longest package timeout (or
    django-q2's ``timeout`` for plain tasks), plus a few lease periods of slack."""
    limits = [task_timeout(spec) for spec in registry.all_handlers().values()]
    longest = max([task_timeout(None), q2.task_timeout(), *limits])
    return longest + STALL_LEASES * float(conf.get("LEASE_SECONDS"))
