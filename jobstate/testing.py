"""Run jobs in a project's own tests (docs/howto/testing.md).

The jobs run as a worker runs them (``jobstate.worker.runner``: claim, begin, the
handler, the outcome written through the service layer), inline in the test's
thread and on its database connection: a job the test enqueued inside its
transaction (Django's ``TestCase``, pytest-django's ``django_db``) is visible to
them, and nothing here is a second way of running a job.

Inside such a transaction the worker's heartbeat thread, on a connection of its
own, cannot see the job: the progress it would write later (``ctx.progress``
calls closer together than ``PROGRESS_FLUSH_SECONDS``) is written at once by the
handler instead, and the lease is not renewed (``IN_TRANSACTION``); on PostgreSQL
the heartbeat found no job and the handler was interrupted as if its lease were
lost.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from jobstate.models import Job
from jobstate.worker import connections, runner

__all__ = ["drain", "transitions"]

WORKER_ID = "test"

# Inside a test's transaction: each progress call written at once, and no lease
# renewal (the heartbeat's connection cannot see the job, nor does the lease's
# renewal, which waits for a commit, ever come): a lease longer than any test's
# handler, which its own timeout still bounds. Nor is a handler deaf to its
# interrupt given up (INTERRUPT_GRACE_SECONDS): its outcome would be written on a
# connection of its own, which cannot see the job either (on SQLite it waited out
# the busy timeout, twice); the handler's own outcome stands when it returns.
IN_TRANSACTION = {
    "PROGRESS_FLUSH_SECONDS": 0,
    "HEARTBEAT_SECONDS": 3600,
    "LEASE_SECONDS": 7200,
    "INTERRUPT_GRACE_SECONDS": 3600,
}


def drain(*, kinds: list[str] | None = None, max_jobs: int = 1000, now: datetime | None = None) -> int:
    """Run every ready job inline, and the jobs they make ready (retries without
    backoff, children, a woken workflow), until none is ready; return how many runs
    there were (a job retried twice counts three).

    ``kinds``: only jobs of these kinds (a list of kind names; None: every kind).
    ``max_jobs``: stop after that many runs. ``now``: run the jobs due by then too,
    as if the clock read ``now`` (a timezone-aware datetime when ``USE_TZ``; one
    in the past is taken as the real time): a retry waiting out its backoff, a
    ``Suspend(until=...)``; the claim is recorded at ``now``, the rest of the
    history at the real time. The handlers' clock does not move: one that
    suspends itself until a time after the real one (``timezone.now() + 5 min``)
    is due again by ``now`` at once, and runs until ``max_jobs``."""
    if now is not None:
        now = max(now, timezone.now())  # a past one would leave out the jobs due now
    if not connection.in_atomic_block:
        return runner.drain(WORKER_ID, kinds, max_jobs, now=now)
    kept = connections.keep_in_transaction.set(True)  # the test's connection: never closed
    try:
        with override_settings(JOBSTATE={**(getattr(settings, "JOBSTATE", None) or {}), **IN_TRANSACTION}):
            return runner.drain(WORKER_ID, kinds, max_jobs, now=now)
    finally:
        connections.keep_in_transaction.reset(kept)


def transitions(job: Job | Any) -> list[str]:
    """The names of a job's history rows, oldest first ("enqueue", "claim",
    "requeue", "complete"...; a workflow's step decisions included): ``job`` is a
    ``Job`` or its id."""
    pk = job.pk if isinstance(job, Job) else job
    return list(Job.objects.get(pk=pk).events.values_list("transition", flat=True))
