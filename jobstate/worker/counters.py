"""The shared-memory counters of one django-q2 cluster running jobstate jobs.

Created by the broker in the sentinel, before it forks the pusher and the
worker processes (``jobstate.worker.shared``; without ``fork`` they are off and the broker
falls back to its database checks):

- ``pending``: job packages handed to django-q2 and not yet picked up by a
  worker process; ``plain``: the same for plain django-q2 tasks (they share
  django-q2's bounded queue). The pusher adds what it hands out, a worker
  subtracts what it picks up; the pusher claims only what fits under the
  prefetch limit and django-q2's queue limit.
- ``busy``: the worker processes inside ``execute`` (running a job, or chaining
  to their next one), by pid: unless ``PREFETCH`` is set the pusher claims only
  for the others, the idle ones. A process killed inside ``execute`` never
  leaves its slot; the pusher clears the slots of processes that are gone.
"""

from __future__ import annotations

import os
from typing import Any

from jobstate.worker import q2, shared

# The django-q2 ack id of a job package (plain tasks have their OrmQ id).
JOB_ACK_PREFIX = "job:"

pending: shared.Counter | None = None
plain: shared.Counter | None = None
busy: shared.Slots | None = None


def create() -> None:
    """In the sentinel (the broker's constructor): the counters, once."""
    global pending, plain, busy
    if pending is None:
        pending = shared.Counter()
    if plain is None:
        plain = shared.Counter()
    if busy is None:
        # Room for every worker process and the replacements of killed ones.
        busy = shared.Slots(max(8, 4 * q2.workers()))


def is_job(task_id: Any) -> bool:
    return isinstance(task_id, str) and task_id.startswith(JOB_ACK_PREFIX)


def picked_up() -> None:
    """Called by a worker process as it takes a job package off the queue."""
    # Busy first: in between, the pusher would see one free place too many.
    if busy is not None:
        busy.enter(os.getpid())
    if pending is not None:
        pending.add(-1)


def done() -> None:
    """Called by a worker process as it returns from ``execute`` to django-q2."""
    if busy is not None:
        busy.leave(os.getpid())


def nothing_waiting() -> bool:
    """True when no package (job or plain task) waits in this cluster's queue, so
    a worker process that ended a job may claim its next one itself. False when
    the counters are not shared (no ``fork``): the worker then returns to django-q2."""
    if pending is None or plain is None or not pending.shared:
        return False
    return pending.get() == 0 and plain.get() == 0


def _plain_picked_up(task: dict[str, Any]) -> None:
    """In a worker process: count a plain task off (jobs count themselves off in ``execute``)."""
    if plain is not None and not is_job(task.get("ack_id")):
        plain.add(-1)


q2.on_task_start(_plain_picked_up, uid="jobstate.worker.counters.plain")
