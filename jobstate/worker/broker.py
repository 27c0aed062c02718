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

Claims are sized to demand (``jobstate.worker.room``), and the pusher keeps
the leases of the jobs it handed out until a worker process takes them
(``jobstate.worker.leases``). An idle pusher waits for a NOTIFY on PostgreSQL
(``jobstate.worker.listen``) and polls briefly on SQLite.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from typing import Any, cast

from django.db import Error as DatabaseErrors
from django.db import close_old_connections, connection, connections

from jobstate import registry, services
from jobstate.models import Job
from jobstate.worker import counters, q2
from jobstate.worker.clock import ClockWatch
from jobstate.worker.cluster import cluster_id, name_cluster
from jobstate.worker.counters import JOB_ACK_PREFIX
from jobstate.worker.leases import Handed, Leases
from jobstate.worker.listen import Listener
from jobstate.worker.outage import Outage
from jobstate.worker.packages import EXECUTE, package
from jobstate.worker.room import Room
from jobstate.worker.supervisor import supervisor

__all__ = ["EXECUTE", "JobBroker", "cluster_id"]

logger = logging.getLogger("jobstate.worker")

# How often a busy pusher also looks at django-q2's own queue (seconds).
PLAIN_TASK_INTERVAL = 1.0
# An idle pusher on SQLite looks for ready jobs this often (a read, no lock).
SQLITE_POLL = 0.05


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


class JobBroker(Room, Leases, q2.OrmBroker):  # type: ignore[misc]  # django-q2 is untyped (Any)
    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        counters.create()
        name_cluster()
        self._start()

    def _start(self) -> None:
        """The state a broker keeps in its own process: django-q2 pickles only the
        list key and info (a pusher started by ``spawn``, macOS's default, unpickles
        the broker), so everything else starts afresh here."""
        self._listener: Listener | None = None
        self._outage = Outage(logger, "jobstate broker")
        self._exit_hooked = 0
        self._clock = ClockWatch()
        self._reset()

    def _reset(self) -> None:
        self._next_plain = 0.0
        self._reset_room()
        self._reset_leases()

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
            self._waiting.extend(Handed(job.pk, job.lease_token, now) for job in jobs)
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
        self._start()


_is_job = counters.is_job
