"""The django-q2 adapter: the one module that reaches into django-q2's internals.

Tested with django-q2 1.11 (``TESTED``; requirements.txt and pyproject.toml pin
the same range). A django-q2 upgrade should touch only this file. What jobstate
takes from django-q2, and why:

- ``OrmBroker``: django-q2's ORM broker, the base class of
  ``jobstate.worker.broker.JobBroker``. Plain django-q2 tasks (schedules,
  ``async_task``) keep travelling through its ``OrmQ`` table.
- ``take_plain``: django-q2's ``ORM.dequeue`` re-implemented without its
  sleep (the jobstate pusher decides when to wait), and ``plain_locked``, the
  plain tasks a worker took and has not acknowledged yet.
- ``workers``, ``queue_limit``, ``poll``, ``task_timeout``, ``bulk``: the
  cluster's settings as django-q2 resolved them (``Conf``). The pusher never
  hands out more than ``queue_limit`` packages: a full ``multiprocessing``
  queue would block it, and with it the renewal of waiting jobs' leases.
- ``on_task_start``: django-q2's ``pre_execute`` signal, sent in a worker
  process as it takes a task off the queue; jobstate counts plain tasks with it.
- ``on_worker_spawn``: django-q2's ``post_spawn`` signal, sent in a worker
  process as it starts; jobstate records the process (idle) in WorkerProcess.
- ``at_clean_exit``: django-q2's worker processes and pusher are
  ``multiprocessing`` children that end by returning from their loops (the
  cluster stopping, a worker recycled); jobstate then removes their
  WorkerProcess rows.
- ``rearm_hard_limit``: django-q2 enforces a task's ``timeout`` in the worker
  with ``SIGALRM`` (``TimeoutHandler``), armed once per task; a worker that
  chains jobs re-arms it for each job it starts.
- ``sign`` / ``SignedPackage``, ``TimeoutException``: the signed package a
  worker process unpacks, and the exception django-q2 raises at its hard limit.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import signal
import threading
from collections.abc import Callable
from typing import Any, cast

from django.utils import timezone
from django_q.brokers.orm import ORM as OrmBroker
from django_q.conf import Conf
from django_q.exceptions import TimeoutException
from django_q.models import OrmQ
from django_q.signals import post_spawn, pre_execute
from django_q.signing import SignedPackage

__all__ = [
    "TESTED",
    "OrmBroker",
    "OrmQ",
    "SignedPackage",
    "TimeoutException",
    "bulk",
    "on_task_start",
    "orm_alias",
    "plain_locked",
    "poll",
    "queue_limit",
    "sign",
    "take_plain",
    "task_timeout",
    "workers",
]

# The django-q2 versions this adapter is tested with (keep in step with requirements.txt).
TESTED = ">=1.11,<1.12"


def workers() -> int:
    return int(Conf.WORKERS or 1)


def queue_limit() -> int:
    """django-q2's bound on its in-memory task queue (0: unbounded)."""
    return int(Conf.QUEUE_LIMIT or 0)


def poll() -> float:
    return float(Conf.POLL)


def task_timeout() -> int:
    return int(Conf.TIMEOUT or 0)


def bulk() -> int:
    return int(Conf.BULK or 1)


def orm_alias() -> str:
    return Conf.ORM or "default"


def sign(package: dict[str, Any]) -> str:
    return cast(str, SignedPackage.dumps(package))


def take_plain(broker: OrmBroker, limit: int) -> list[tuple[Any, str]]:
    """Lock up to ``limit`` plain tasks from django-q2's queue: ``ORM.dequeue``
    without its sleep. Returns ``(ack id, signed payload)`` pairs."""
    queue = OrmQ.objects.using(orm_alias())
    rows = list(queue.filter(key=broker.list_key, lock__lt=timezone.now())[:limit])
    taken = []
    for row in rows:
        if queue.filter(id=row.id, lock=row.lock).update(lock=broker.timeout(row)):
            taken.append((row.pk, row.payload))
    return taken


def plain_locked(broker: OrmBroker) -> int:
    """Plain tasks taken and not yet acknowledged (they stay locked until then)."""
    locked: int = OrmQ.objects.using(orm_alias()).filter(key=broker.list_key, lock__gt=timezone.now()).count()
    return locked


def on_task_start(callback: Callable[[dict[str, Any]], None], uid: str) -> None:
    """Call ``callback(task)`` in a worker process as it takes any task (job or
    plain) off django-q2's queue."""

    def receiver(sender: Any, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if task is not None:
            callback(task)

    pre_execute.connect(receiver, dispatch_uid=uid, weak=False)


def on_worker_spawn(callback: Callable[[], None], uid: str) -> None:
    """Call ``callback()`` in each worker process as it starts, before its first task."""

    def receiver(sender: Any, **kwargs: Any) -> None:
        callback()

    post_spawn.connect(receiver, dispatch_uid=uid, weak=False)


# Before multiprocessing's own exit work (it joins the children of the process).
EXIT_PRIORITY = 10


def at_clean_exit(callback: Callable[[], None]) -> bool:
    """In a django-q2 child process (a worker process, the pusher): call
    ``callback()`` when the process ends by returning from its loop, as on a
    cluster's graceful stop (SIGTERM) or a worker's recycling. multiprocessing
    runs its exit finalizers then (a child leaves with ``os._exit``, so ``atexit``
    would not); a process killed runs nothing. False (nothing done) outside a
    child process."""
    if multiprocessing.parent_process() is None:
        return False
    multiprocessing.util.Finalize(None, callback, exitpriority=EXIT_PRIORITY)
    return True


def rearm_hard_limit(seconds: float) -> bool:
    """In a worker process running a django-q2 task: make django-q2's hard limit
    (its ``SIGALRM``, raising ``TimeoutException``) fire ``seconds`` from now.
    False (nothing done) outside such a task or off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    signal.alarm(max(1, int(seconds)))
    return True
