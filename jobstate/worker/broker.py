"""The Job table as django-q2's broker.

``Q_CLUSTER["broker_class"] = "jobstate.worker.broker.JobBroker"``. The cluster's
pusher calls ``dequeue()``, which claims ready jobs of the kinds registered in
this process with ``services.claim`` and hands django-q2 one slim signed
package per job (``jobstate.worker.packages.package``). The Job table stays the
only source of truth, so acknowledge/fail are no-ops for jobs and django-q2
writes no Task row for them (``"save": False``) unless ``execute`` itself
crashes. Plain django-q2 tasks (the scheduled reaper and pruner, or any
``async_task``) still travel through django-q2's ORM queue, which this class
inherits. Everything that touches django-q2 itself goes through
``jobstate.worker.q2``.

Claims are sized to demand: one claim (one round trip) takes as many jobs as
the cluster has room for (``prefetch``: free worker slots plus a short
prefetch), and a busy pusher waits on a shared-memory counter, without
touching the database, until a worthwhile batch fits. An idle pusher waits
for a NOTIFY on PostgreSQL (``jobstate.worker.listen``) and polls briefly on
SQLite.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import socket
import time
from collections import deque
from typing import Any, NamedTuple, cast

from django.db import DatabaseError, close_old_connections, connection, connections
from django.db import Error as DatabaseErrors

from jobstate import conf, registry, services
from jobstate.models import Job
from jobstate.services import workers as worker_processes
from jobstate.states import Status
from jobstate.worker import clock, counters, q2
from jobstate.worker.clock import ClockWatch
from jobstate.worker.connections import at_exit
from jobstate.worker.counters import JOB_ACK_PREFIX
from jobstate.worker.listen import Listener
from jobstate.worker.outage import Outage
from jobstate.worker.packages import EXECUTE, package, task_timeout
from jobstate.worker.supervisor import supervisor

__all__ = ["EXECUTE", "JobBroker", "cluster_id", "max_wait"]

logger = logging.getLogger("jobstate.worker")

# How often a busy pusher also looks at django-q2's own queue (seconds).
PLAIN_TASK_INTERVAL = 1.0
# How often a pusher with no worthwhile room looks at the shared counter again,
# and how long it waits so at most before returning to django-q2 (seconds).
FULL_WAIT = 0.005
FULL_WAIT_MAX = 0.1
# An idle pusher on SQLite looks for ready jobs this often (a read, no lock).
SQLITE_POLL = 0.05
# Lease periods, past the longest hard limit, that a job may wait in django-q2's
# queue while no worker process takes anything before its lease is left to expire.
STALL_LEASES = 3

_cluster_id: str | None = None


def _worker_spawned() -> None:
    """In a new worker process: record it in WorkerProcess at once, idle, so an
    operator sees an idle cluster's workers before they run their first job."""
    if multiprocessing.parent_process() is None:
        return
    cluster = cluster_id()
    try:
        supervisor().serve_as(f"{cluster}:{os.getpid()}", cluster)
    except Exception:  # never keep a worker process from starting
        logger.exception("jobstate: could not start the worker process's heartbeat")


q2.on_worker_spawn(_worker_spawned, uid="jobstate.worker.broker.spawned")


def _pusher_gone(name: str) -> None:
    """The pusher ends cleanly (the cluster stops): its WorkerProcess row goes
    (waited for a heartbeat interval at most: ``connections.at_exit``)."""
    at_exit(worker_processes.gone, name, what="the pusher's row")


class _Handed(NamedTuple):
    pk: Any
    token: Any
    at: float


def cluster_id() -> str:
    """``<hostname>:<qcluster pid>`` for claims; workers append their own pid."""
    return _cluster_id or f"{socket.gethostname()}:{os.getppid()}"


class JobBroker(q2.OrmBroker):  # type: ignore[misc]  # django-q2 is untyped (Any)
    def __init__(self, list_key: str | None = None) -> None:
        global _cluster_id
        super().__init__(list_key=list_key)
        counters.create()
        if _cluster_id is None:
            # Built in the sentinel, whose parent is the qcluster process.
            _cluster_id = f"{socket.gethostname()}:{os.getppid()}"
        self._listener: Listener | None = None
        self._outage = Outage(logger, "jobstate broker")
        self._exit_hooked = 0  # the pid whose pusher row is removed at its clean exit
        self._clock = ClockWatch()  # the pusher's clock (it claims, and renews leases)
        self._reset()

    def _reset(self) -> None:
        self._next_reap = self._next_renew = self._next_plain = self._next_reconcile = 0.0
        self._next_forget = 0.0
        self._handed = self._plain_handed = self._taken = self._renewed = 0
        self._last_pickup = 0.0
        # Jobs handed to django-q2, oldest first; the last ``counters.pending`` of them
        # are still waiting for a worker process.
        self._waiting: deque[_Handed] = deque()

    @staticmethod
    def get_connection(list_key: str | None = None) -> Any:
        # Unlike django-q2's ORM broker, keep a healthy connection: closing it
        # on every dequeue (CONN_MAX_AGE=0) would reconnect for every batch.
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
                conn.close()
        return q2.OrmQ.objects.using(q2.orm_alias())

    def info(self) -> str:
        return "jobstate Job table (+ django-q2 ORM queue)"

    # -- what the pusher calls -------------------------------------------------

    def dequeue(self) -> list[tuple[Any, str]] | None:
        try:
            tasks = self._dequeue()
        except DatabaseErrors as exc:  # InterfaceError too (psycopg2's "connection already closed")
            # A traceback for the first failure in a row only (an outage would log one a poll).
            self._outage.failed("database error; retrying after the poll interval", exc)
            close_old_connections()
            for conn in connections.all(initialized_only=True):
                conn.close()
            time.sleep(q2.poll())
            return None
        self._outage.ended()
        return tasks

    def _dequeue(self) -> list[tuple[Any, str]] | None:
        self.get_connection()
        now = time.monotonic()
        reap = now >= self._next_reap
        # Renew first: the reaper must never take jobs still waiting in memory.
        if reap or now >= self._next_renew:
            self._renew(now)
        if reap:
            self._reap(now)
        tasks: list[tuple[Any, str]] = []
        free = self._free(now)
        if now >= self._next_plain and free > 0:
            self._next_plain = now + PLAIN_TASK_INTERVAL
            plain = q2.take_plain(self, min(q2.bulk(), free))
            if plain and counters.plain is not None:
                counters.plain.add(len(plain))
            self._plain_handed += len(plain)
            free -= len(plain)
            tasks.extend(plain)
        limit = self.prefetch(now)
        room = min(self._room(now, limit), free)
        # Only kinds this process can run: in a mixed-version deployment
        # another cluster's kinds wait for a cluster that has their handler.
        kinds = sorted(registry.all_handlers())
        claimable = room > 0 and bool(kinds)
        if claimable and self._worthwhile(room, limit):
            listener = self._listen()
            if listener is not None:
                listener.drain()
            jobs = self._claim(kinds, room)
            if jobs and counters.pending is not None:
                counters.pending.add(len(jobs))
            self._handed += len(jobs)
            self._waiting.extend(_Handed(job.pk, job.lease_token, now) for job in jobs)
            tasks.extend((f"{JOB_ACK_PREFIX}{job.pk}", package(job)) for job in jobs)
            if tasks:
                return tasks
            self._idle(q2.poll(), kinds)
            return None
        if tasks:
            return tasks
        if claimable or room <= 0:
            self._wait_for_room(limit)
        else:
            self._idle(q2.poll(), kinds)
        return None

    def _claim(self, kinds: list[str], limit: int) -> list[Job]:
        return services.claim(cluster_id(), kinds=kinds, limit=limit)

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

    def _reap(self, now: float) -> None:
        interval = float(conf.get("REAP_INTERVAL_SECONDS") or 0)
        self._next_reap = now + (interval if interval > 0 else float("inf"))
        if interval <= 0:
            return
        report = services.requeue_expired()
        if report.total:
            logger.warning(
                "jobstate reaper: requeued %d, failed %d, cancelled %d job(s) whose worker was lost%s",
                len(report.requeued),
                len(report.failed),
                len(report.cancelled),
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

    def _still_waiting(self, now: float) -> list[_Handed]:
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

    def _listen(self) -> Listener | None:
        if self._listener is None and Listener.available():
            self._listener = Listener()
        return self._listener

    def _idle(self, seconds: float, kinds: list[str]) -> None:
        """Nothing to claim: wait for a NOTIFY (PostgreSQL), or look every
        ``SQLITE_POLL`` seconds with a read that takes no lock (SQLite)."""
        listener = self._listen()
        if listener is not None:
            listener.wait(seconds)
            return
        if connection.vendor != "sqlite" or not kinds:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(SQLITE_POLL, max(0.0, deadline - time.monotonic())))
            if Job.objects.ready().filter(kind__in=kinds).exists():
                return

    def close(self) -> None:
        """Drop the LISTEN connection (the pusher's ends with its process)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # -- the rest of django-q2's broker interface ------------------------------

    def acknowledge(self, task_id: Any) -> None:
        if not _is_job(task_id):
            super().acknowledge(task_id)

    def fail(self, task_id: Any) -> None:
        if not _is_job(task_id):
            super().fail(task_id)

    def delete(self, task_id: Any) -> None:
        if not _is_job(task_id):
            super().delete(task_id)

    def queue_size(self) -> int:
        return Job.objects.ready().count() + cast(int, super().queue_size())

    def lock_size(self) -> int:
        return Job.objects.processing().count() + cast(int, super().lock_size())

    def purge_queue(self) -> Any:
        # Only django-q2's own queue: jobs are ended through jobstate.services.
        return super().purge_queue()

    def ping(self) -> bool:
        Job.objects.exists()
        return True

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        self._listener = None
        self._outage = Outage(logger, "jobstate broker")
        self._reset()


_is_job = counters.is_job


def max_wait() -> float:
    """Seconds a job may wait in django-q2's queue while no worker process takes
    anything: every busy worker frees up within the longest package timeout (or
    django-q2's ``timeout`` for plain tasks), plus a few lease periods of slack."""
    limits = [task_timeout(spec) for spec in registry.all_handlers().values()]
    longest = max([task_timeout(None), q2.task_timeout(), *limits])
    return longest + STALL_LEASES * float(conf.get("LEASE_SECONDS"))
