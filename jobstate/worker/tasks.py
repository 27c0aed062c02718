"""The functions django-q2 worker processes call.

``execute`` runs a job the broker claimed; ``reap`` and ``prune`` are the
targets of the schedules ``manage.py jobstate_schedule`` installs;
``run_by_id`` is the id-only alternative (a plain django-q2 message carrying
a job id through the ORM broker; the README's "Why the Job table is the
broker" says why it is not the default).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from django.db import close_old_connections, connection
from django_q.exceptions import TimeoutException

from jobstate import conf, services
from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job
from jobstate.worker import broker
from jobstate.worker.runner import end_attempt, release, run_job

logger = logging.getLogger("jobstate.worker")


def worker_id(claimed_by: str) -> str:
    """``<hostname>:<qcluster pid>:<worker pid>``: the history names the process."""
    return f"{claimed_by}:{os.getpid()}"


def keep_connection() -> None:
    """Let this worker process reuse its database connection for the next job.

    django-q2 runs ``close_old_connections()`` before every task, which with
    ``CONN_MAX_AGE=0`` means a new connection (and its session setup) per job.
    A worker process is long-lived, so jobstate keeps its connection for up to
    ``JOBSTATE["WORKER_CONN_MAX_AGE"]`` seconds (None: follow CONN_MAX_AGE).
    Broken connections are still replaced: Django health-checks a connection
    that saw an error before reusing it.
    """
    age = conf.get("WORKER_CONN_MAX_AGE")
    if age is None or connection.connection is None or connection.close_at is None:
        return
    connection.close_at = max(connection.close_at, time.monotonic() + float(age))


def execute(job: Job) -> str:
    """Run a job the broker claimed for this cluster; return its outcome.

    The job may have waited in django-q2's in-memory queue: one heartbeat first
    checks that the lease is still ours (the reaper may have given it to
    someone else meanwhile) and relabels it with this worker process. Taking
    the package ended the pusher's renewal of its lease, so if anything fails
    before the handler starts, the job is handed back here (requeued, failed
    or cancelled, with its history), or else left to the reaper.
    """
    broker.picked_up()
    me = worker_id(job.worker_id or broker.cluster_id())
    try:
        beat = services.heartbeat(job, job.lease_token, worker_id=me)
        job.worker_id = me
        if beat.cancel_requested:
            services.cancel_now(job, job.lease_token, reason="cancelled before it started")
            return "cancelled"
    except LeaseLost:
        logger.info("Job %s was taken from this cluster while it waited; skipped", job.pk)
        keep_connection()
        return "skipped"
    except Exception as exc:
        job.worker_id = me
        release(job, exc, "the worker could not start the job")
        raise  # django-q2 records the failed package too
    try:
        outcome = run_job(job, me)
    except TimeoutException:
        # django-q2's hard limit fired: the handler ignored jobstate's own
        # timeout and cancel interrupts. Record the failed (or cancelled)
        # attempt, then let django-q2 replace this worker process.
        close_old_connections()
        with contextlib.suppress(LeaseLost, InvalidTransition):
            end_attempt(
                job, job.lease_token, "Stopped by the worker's hard time limit", error_type="HardTimeout"
            )
        raise
    keep_connection()
    return outcome


def run_by_id(job_id: Any) -> str:
    """Id-only alternative: claim this one job now and run it."""
    me = f"{broker.cluster_id()}:{os.getpid()}"
    try:
        job = services.start(job_id, me)
    except (InvalidTransition, Job.DoesNotExist):
        return "skipped"  # cancelled, or already run by someone else
    return run_job(job, me)


def reap() -> dict[str, int]:
    """Scheduled: requeue (or fail) jobs whose worker was lost."""
    report = services.requeue_expired()
    return {
        "requeued": len(report.requeued),
        "failed": len(report.failed),
        "cancelled": len(report.cancelled),
    }


def prune(days: float | None = None) -> dict[str, int]:
    """Scheduled: delete finished jobs older than the retention period."""
    from jobstate.worker.retention import prune as prune_jobs

    return prune_jobs(days).as_dict()
