"""The Job table as django-q2's broker.

``Q_CLUSTER["broker_class"] = "jobstate.worker.broker.JobBroker"``. The cluster's
pusher calls ``dequeue()``, which claims a batch of ready jobs of the kinds
registered in this process with ``services.claim`` (``FOR UPDATE SKIP LOCKED``
on PostgreSQL, per-kind limits) and hands django-q2 one signed package per job,
calling ``jobstate.worker.tasks.execute`` with the claimed job. The Job table stays the
only source of truth, so acknowledge/fail are no-ops for jobs and django-q2
writes no Task row for them (``"save": False``) unless ``execute`` itself
crashes. Plain django-q2 tasks (the scheduled reaper and pruner, or any
``async_task``) still travel through django-q2's ORM queue, which this class
inherits.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import socket
import time
import uuid
from collections import deque
from typing import Any, NamedTuple

from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signals import pre_execute
from django_q.signing import SignedPackage

from jobstate import conf, registry, services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker.listen import Listener
from jobstate.worker.runner import hard_limit_for

logger = logging.getLogger("jobstate.worker")

JOB_ACK_PREFIX = "job:"
EXECUTE = "jobstate.worker.tasks.execute"
# How often a busy pusher also looks at django-q2's own queue (seconds).
PLAIN_TASK_INTERVAL = 1.0
# How long a pusher with no free room waits before looking again (seconds).
FULL_WAIT = 0.01
# How often the pusher measures the rate at which workers pick jobs up (seconds).
RATE_WINDOW = 0.5
# Lease periods, past the longest hard limit, that a job may wait in django-q2's
# queue while no worker process takes anything before its lease is left to expire.
STALL_LEASES = 3


class _Pending:
    """Packages handed to django-q2 but not yet picked up by a worker process.

    A counter in shared memory, created in the sentinel before it forks the
    pusher and the workers. The pusher adds what it hands out, a worker
    subtracts each package it picks up; the pusher claims only what fits under
    the prefetch limit (a busy cluster does not sit on jobs other clusters
    could run) and django-q2's queue limit. Without fork it is off.
    """

    def __init__(self) -> None:
        shared = "fork" in multiprocessing.get_all_start_methods()
        self.value = multiprocessing.get_context("fork").Value("i", 0) if shared else None

    def add(self, n: int) -> None:
        if self.value is not None:
            with self.value.get_lock():
                # Never below zero: after a correction (lower_to) the packages
                # still queued are picked up without having been counted.
                self.value.value = max(0, self.value.value + n)

    def get(self) -> int:
        return self.value.value if self.value is not None else 0

    def lower_to(self, n: int) -> None:
        if self.value is not None:
            with self.value.get_lock():
                self.value.value = min(self.value.value, n)


_pending: _Pending | None = None
# Plain django-q2 tasks (schedules, async_task) handed out and not yet picked up:
# they share django-q2's bounded queue with the jobs.
_plain: _Pending | None = None
_cluster_id: str | None = None


def picked_up() -> None:
    """Called by a worker process as it takes a job package off the queue."""
    if _pending is not None:
        _pending.add(-1)


def _plain_picked_up(sender: Any, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """django-q2's ``pre_execute``, in a worker process: count a plain task off
    (jobs count themselves off in ``execute``)."""
    if _plain is not None and task is not None and not _is_job(task.get("ack_id")):
        _plain.add(-1)


pre_execute.connect(_plain_picked_up, dispatch_uid="jobstate.worker.broker.plain")


class _Handed(NamedTuple):
    pk: Any
    token: Any
    at: float


def cluster_id() -> str:
    """``<hostname>:<qcluster pid>`` for claims; workers append their own pid."""
    return _cluster_id or f"{socket.gethostname()}:{os.getppid()}"


class JobBroker(ORM):
    def __init__(self, list_key: str | None = None) -> None:
        global _pending, _plain, _cluster_id
        super().__init__(list_key=list_key)
        if _pending is None:
            _pending = _Pending()
        if _plain is None:
            _plain = _Pending()
        if _cluster_id is None:
            # Built in the sentinel, whose parent is the qcluster process.
            _cluster_id = f"{socket.gethostname()}:{os.getppid()}"
        self._listener: Listener | None = None
        self._reset()

    def _reset(self) -> None:
        self._next_reap = self._next_renew = self._next_plain = self._next_reconcile = 0.0
        self._handed = self._picked = self._plain_handed = self._taken = 0
        self._rate = self._rate_at = self._last_pickup = 0.0
        # Jobs handed to django-q2, oldest first; the last ``_pending`` of them
        # are still waiting for a worker process.
        self._waiting: deque[_Handed] = deque()

    @staticmethod
    def get_connection(list_key: str | None = None) -> Any:
        # Unlike django-q2's ORM broker, keep a healthy connection: closing it
        # on every dequeue (CONN_MAX_AGE=0) would reconnect for every batch.
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
                conn.close()
        return OrmQ.objects.using(Conf.ORM or "default")

    def info(self) -> str:
        return "jobstate Job table (+ django-q2 ORM queue)"

    # -- what the pusher calls -------------------------------------------------

    def dequeue(self) -> list[tuple[Any, str]] | None:
        try:
            return self._dequeue()
        except DatabaseError:
            logger.exception("jobstate broker: database error; retrying after the poll interval")
            close_old_connections()
            for conn in connections.all(initialized_only=True):
                conn.close()
            time.sleep(Conf.POLL)
            return None

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
            plain = self._plain_tasks(min(int(Conf.BULK), free))
            if plain and _plain is not None:
                _plain.add(len(plain))
            self._plain_handed += len(plain)
            free -= len(plain)
            tasks.extend(plain)
        room = min(self._room(now), free)
        kinds = sorted(registry.all_handlers())
        if room > 0 and kinds:
            listener = self._listen()
            if listener is not None:
                listener.drain()
            # Only kinds this process can run: in a mixed-version deployment
            # another cluster's kinds wait for a cluster that has their handler.
            batch = min(room, int(conf.get("CLAIM_BATCH")))
            jobs = services.claim(cluster_id(), kinds=kinds, limit=batch)
            if jobs and _pending is not None:
                _pending.add(len(jobs))
            self._handed += len(jobs)
            self._waiting.extend(_Handed(job.pk, job.lease_token, now) for job in jobs)
            tasks.extend((f"{JOB_ACK_PREFIX}{job.pk}", package(job)) for job in jobs)
        if tasks:
            return tasks
        if room <= 0:
            time.sleep(FULL_WAIT)
        else:
            self._idle(Conf.POLL)
        return None

    def prefetch(self, now: float) -> int:
        """How many claimed jobs may wait for a worker: ``PREFETCH`` if set, else
        about ``PREFETCH_SECONDS`` of work at the rate workers pick jobs up, at
        least one per worker process and at most two claim batches. Short jobs
        get big claim batches; long ones are not hoarded by one busy cluster.
        Never more than django-q2's ``queue_limit``: a full queue would block
        the pusher, and with it the renewal of the leases of waiting jobs."""
        fixed = conf.get("PREFETCH")
        wanted = int(fixed) if fixed else self._adaptive_prefetch(now)
        limit = int(Conf.QUEUE_LIMIT or 0)
        return min(wanted, limit) if limit > 0 else wanted

    def _adaptive_prefetch(self, now: float) -> int:
        if now - self._rate_at >= RATE_WINDOW:
            picked = self._handed - (_pending.get() if _pending is not None else 0)
            if self._rate_at:
                seen = (picked - self._picked) / (now - self._rate_at)
                self._rate = (self._rate + seen) / 2
            self._picked, self._rate_at = picked, now
        wanted = math.ceil(self._rate * float(conf.get("PREFETCH_SECONDS")))
        return max(int(Conf.WORKERS), min(wanted, 2 * int(conf.get("CLAIM_BATCH"))))

    def _room(self, now: float) -> int:
        limit = self.prefetch(now)
        if _pending is None or _pending.value is None:
            return limit
        room = limit - _pending.get()
        if room <= 0:
            self._reconcile(now)
            room = limit - _pending.get()
        return room

    def _free(self, now: float) -> int:
        """Places left in django-q2's bounded in-memory queue (jobs and plain tasks)."""
        limit = int(Conf.QUEUE_LIMIT or 0)
        if limit <= 0 or _pending is None or _pending.value is None or _plain is None:
            return limit if limit > 0 else 1 << 30
        free = limit - _pending.get() - _plain.get()
        if free <= 0:
            self._reconcile(now)
            free = limit - _pending.get() - _plain.get()
        return free

    def _reconcile(self, now: float) -> None:
        """A pusher that died between taking work and handing it over, or a worker
        process that died right after taking a package, leaves a counter too high;
        the database bounds the real numbers."""
        if now < self._next_reconcile or _pending is None or _plain is None:
            return
        self._next_reconcile = now + max(Conf.POLL, 1.0)
        waiting = Job.objects.filter(status=Status.PROCESSING, worker_id=cluster_id()).count()
        _pending.lower_to(waiting)
        # A plain task stays locked in django-q2's queue until it is acknowledged.
        taken = self.get_connection().filter(key=self.list_key, lock__gt=timezone.now()).count()
        _plain.lower_to(taken)

    def _reap(self, now: float) -> None:
        interval = float(conf.get("REAP_INTERVAL_SECONDS") or 0)
        self._next_reap = now + (interval if interval > 0 else float("inf"))
        if interval <= 0:
            return
        report = services.requeue_expired()
        if report.total:
            logger.warning(
                "jobstate reaper: requeued %d, failed %d, cancelled %d job(s) whose worker was lost",
                len(report.requeued),
                len(report.failed),
                len(report.cancelled),
            )

    def _renew(self, now: float) -> None:
        """Keep the leases of jobs waiting in django-q2's in-memory queue: a job
        queued behind a long one must not be rescued (and lose an attempt)
        before it has even started. Only those: a job a worker process took
        (and maybe died with before relabelling it) is left to the reaper."""
        self._next_renew = now + float(conf.get("HEARTBEAT_SECONDS"))
        waiting = self._still_waiting(now)
        if not waiting:
            return
        services.extend_leases(cluster_id(), [(w.pk, w.token) for w in waiting])

    def _still_waiting(self, now: float) -> list[_Handed]:
        """The jobs handed out that no worker process has taken yet.

        django-q2's queue is FIFO and a worker counts a job off as soon as it
        takes it, so the jobs still waiting are the last ``_pending`` handed
        out. Should a worker die between taking a package and counting it off,
        the count stays one too high and that job looks waiting: it stops being
        renewed at the next pick-up, or once no worker process has taken
        anything for longer than any task may run (``max_wait``).
        """
        if _pending is not None and _pending.value is not None and _plain is not None:
            waiting = _pending.get()
            while len(self._waiting) > waiting:
                self._waiting.popleft()
            taken = self._handed - waiting + self._plain_handed - _plain.get()
            if taken != self._taken:
                self._taken, self._last_pickup = taken, now
        limit = max_wait()
        while self._waiting and now - max(self._waiting[0].at, self._last_pickup) >= limit:
            self._waiting.popleft()
        return list(self._waiting)

    def _plain_tasks(self, limit: int) -> list[tuple[Any, str]]:
        """django-q2's own queue (schedules, async_task): ORM.dequeue without its sleep."""
        now = timezone.now()
        rows = list(self.get_connection().filter(key=self.list_key, lock__lt=now)[:limit])
        taken = []
        for row in rows:
            if self.get_connection().filter(id=row.id, lock=row.lock).update(lock=self.timeout(row)):
                taken.append((row.pk, row.payload))
        return taken

    def _listen(self) -> Listener | None:
        if self._listener is None and Listener.available():
            self._listener = Listener()
        return self._listener

    def _idle(self, seconds: float) -> None:
        listener = self._listen()
        if listener is None:
            time.sleep(seconds)
        else:
            listener.wait(seconds)

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
        return Job.objects.ready().count() + super().queue_size()

    def lock_size(self) -> int:
        return Job.objects.processing().count() + super().lock_size()

    def purge_queue(self) -> Any:
        # Only django-q2's own queue: jobs are ended through jobstate.services.
        return super().purge_queue()

    def ping(self) -> bool:
        Job.objects.exists()
        return True

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        self._listener = None
        self._reset()


def _is_job(task_id: Any) -> bool:
    return isinstance(task_id, str) and task_id.startswith(JOB_ACK_PREFIX)


def max_wait() -> float:
    """Seconds a job may wait in django-q2's queue while no worker process takes
    anything: every busy worker frees up within the longest hard limit (or
    django-q2's ``timeout`` for plain tasks), plus a few lease periods of slack."""
    limits = [hard_limit_for(spec) for spec in registry.all_handlers().values()]
    longest = max([hard_limit_for(None), int(Conf.TIMEOUT or 0), *limits])
    return longest + STALL_LEASES * float(conf.get("LEASE_SECONDS"))


def package(job: Job) -> str:
    """A signed django-q2 task package that runs ``job`` in a worker process.

    The claimed Job itself travels pickled (no reload in the worker).
    ``timeout`` is the hard limit after which django-q2 stops the worker
    process; jobstate's own soft timeout and cancel grace come first.
    """
    spec = registry.all_handlers().get(job.kind)
    return SignedPackage.dumps(
        {
            "id": uuid.uuid4().hex,
            "name": f"{job.kind} {job.pk}"[:100],
            "func": EXECUTE,
            "args": (job,),
            "kwargs": {},
            "group": "jobstate",
            "save": False,
            "ack_failure": True,
            "timeout": hard_limit_for(spec),
            "started": timezone.now(),
        }
    )
