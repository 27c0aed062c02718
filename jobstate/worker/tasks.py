"""The functions django-q2 worker processes call.

``execute`` runs a job the broker claimed (``jobstate.worker.packages`` builds
its django-q2 message: job id, lease token and kind only); ``reap`` and ``prune`` are the
targets of the schedules ``manage.py jobstate_schedule`` installs;
``run_by_id`` is the id-only alternative (a plain django-q2 message carrying
a job id through the ORM broker; docs/explanation/workers.md, "Why the Job
table is the broker", says why it is not the default).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import time
from typing import Any

from django.db import Error as DatabaseErrors
from django.db import close_old_connections, connection
from django.utils import timezone

from jobstate import conf, registry, services
from jobstate.exceptions import ConcurrencyLimitReached, InvalidTransition, KindPaused, LeaseLost
from jobstate.models import Job
from jobstate.services import workers as worker_processes
from jobstate.states import Status
from jobstate.worker import counters, q2, unheard
from jobstate.worker.cluster import cluster_id
from jobstate.worker.connections import Calls, reconnecting
from jobstate.worker.limits import hard_limit_for
from jobstate.worker.outage import Outage
from jobstate.worker.packages import CHAIN_MARGIN, task_timeout
from jobstate.worker.q2 import TimeoutException
from jobstate.worker.runner import run_job
from jobstate.worker.supervisor import supervisor
from jobstate.worker.unstarted import (
    cancel_unstarted,
    hand_back_stopped,
    hard_timeout_outside,
    paused_unstarted,
    release,
    unknown_kind,
)

logger = logging.getLogger("jobstate.worker")

# ``reconnecting``: a task's first database call found the connection kept between jobs dead.
KEPT_CLOSED = "the database connection kept between jobs was closed"

# This process's chained claims (``chain``): a database outage is a traceback, a line a
# minute and a recovery line, as for the pusher and the heartbeats.
claims_outage = Outage(logger, "jobstate worker")


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


def _serve(me: str, cluster: str) -> None:
    """In a django-q2 worker process (a child of the cluster), record this process
    in WorkerProcess from its heartbeat thread, busy or idle."""
    if multiprocessing.parent_process() is not None:
        supervisor().serve_as(me, cluster)


def _held(job_id: Any, token: Any, kind: str, me: str) -> Job:
    """The job as this worker holds it, for the rare paths that end it before
    it started (its row if it can be read; the writes are guarded by ``token``)."""
    try:
        job = Job.objects.filter(pk=job_id).first()
    except Exception:
        job = None
    if job is None:
        job = Job(pk=job_id, kind=kind)
    job.lease_token = token
    job.worker_id = me
    return job


def execute(job_id: Any, token: Any = None, kind: str | None = None) -> str:
    """Run a job the broker claimed for this cluster, then keep going: claim and
    run this process's next jobs itself (``chain``). Returns the first outcome.

    The job may have waited in django-q2's in-memory queue, reserved: one
    UPDATE (``services.begin``) checks that the lease is still ours (the reaper
    may have given it to someone else meanwhile), charges the attempt, relabels
    the holder with this worker process and loads the job. Taking the package
    ended the pusher's renewal of its lease, so if anything fails before the
    handler starts, the job is handed back here (requeued, without an attempt
    charged, or cancelled, with its history), or else left to the reaper. A job
    of a kind paused since the claim is not begun: ``begin`` hands it back
    (outcome "paused") and the process goes on with its chain.
    """
    started = time.monotonic()
    counters.picked_up()
    try:
        if isinstance(job_id, Job):  # a package from before the slim format
            job_id, token, kind = job_id.pk, job_id.lease_token, job_id.kind
        if token is None:
            # Not the broker's package (each carries the claim's lease token): a
            # hand-made async_task(EXECUTE, job_id). Whatever the job is doing, it is
            # not this process's to run or to end.
            logger.warning("Job %s: a package without a lease token was skipped; nothing ran", job_id)
            return "skipped"
        cluster = cluster_id()
        me = worker_id(cluster)
        _serve(me, cluster)
        spec = registry.all_handlers().get(kind or "")
        if spec is None:
            return unknown_kind(_held(job_id, token, kind or "", me))
        links = Chain(me, started + task_timeout(spec), started)
        try:
            outcome = _execute(job_id, token, kind or "", me, links)
            chain(me, links.hard_deadline, started, links)
        except TimeoutException:
            hand_back_unstarted(me, links)
            raise
        return outcome
    finally:
        counters.done()


UNSTARTED = "its worker's hard time limit fired before it started"


def hand_back_unstarted(me: str, links: Chain) -> None:
    """After django-q2's hard time limit fired: the job this process claimed for
    itself (with an outcome, or begun by a claim) whose handler had not started
    goes back to the queue with its attempt refunded; the reaper would have
    requeued it with the attempt spent (a job with one attempt: failed, never
    run). Begun since the last handler started, and not that handler's job
    (``_run_begun`` ended it): the alarm may land inside the claim's call, after
    its commit, so the job is looked up rather than remembered."""
    close_old_connections()
    try:
        held = Job.objects.filter(worker_id=me, status=Status.PROCESSING, started_at__gte=links.since)
        for job in held.exclude(pk=links.running) if links.running is not None else held:
            if job.lease_token is None:
                # Never stored so (a processing row has a token: a constraint); a
                # copy read without one has nothing to guard the hand-back with.
                logger.warning("Job %s: no lease token to hand it back with; left to the reaper", job.pk)
                continue
            with contextlib.suppress(LeaseLost, InvalidTransition):
                services.hand_back(job, job.lease_token, reason=UNSTARTED)
    except Exception:
        logger.exception("jobstate worker: could not hand back unstarted jobs; the reaper will take them")


def _execute(job_id: Any, token: Any, kind: str, me: str, links: Chain) -> str:
    leased_at, since = time.monotonic(), timezone.now()
    calls = Calls(functools.partial(services.begin, job_id, token, me))
    try:
        begun = reconnecting(calls, KEPT_CLOSED)
    except LeaseLost:
        # Made again on a new connection: the first one may have begun it, unheard.
        held = unheard.begun(job_id, me, since, token) if calls.made > 1 else None
        if held is not None:
            return _run_begun(held, me, links, leased_at)
        logger.info("Job %s was taken from this cluster while it waited; skipped", job_id)
        keep_connection()
        return "skipped"
    except KindPaused as paused:  # handed back by begin; the chain takes other work
        keep_connection()
        return paused_unstarted(job_id, paused)
    except Exception as exc:
        release(_held(job_id, token, kind, me), exc, "the worker could not start the job", refund=True)
        raise  # django-q2 records the failed package too
    except KeyboardInterrupt:
        if _in_caller():  # the operator's Ctrl-C, as in run_job's begin
            hand_back_stopped(_held(job_id, token, kind, me), token)
        raise
    job = begun.job
    if begun.cancel_requested:
        job.worker_id = me
        outcome = cancel_unstarted(job)
        keep_connection()
        return outcome
    return _run_begun(job, me, links, leased_at)


def _in_caller() -> bool:
    """Whether this task runs in its caller's process (django-q2's ``sync`` mode
    runs it there, inline), not in a cluster's worker process (which ignores
    SIGINT): the operator's Ctrl-C then reaches the handler (``run_job``'s ``inline``)."""
    return multiprocessing.parent_process() is None


def _run_begun(job: Job, me: str, links: Chain | None = None, leased_at: float | None = None) -> str:
    """Run ``job``, begun by a call that started at ``leased_at`` (``time.monotonic()``)."""
    if links is not None:
        # Jobs begun before this one ran their handlers (or this is the first).
        links.running, links.since = job.pk, timezone.now()
    # Taken now: an outcome stored clears the job's copy (end_attempt refuses a
    # token of None, which would have failed the requeued job without a lease).
    token = job.lease_token
    try:
        outcome = run_job(job, me, then=links, inline=_in_caller(), leased_at=leased_at)
    except TimeoutException:
        # django-q2's hard limit fired: the handler ignored jobstate's own
        # timeout and cancel interrupts. run_job recorded the failed (or
        # cancelled) attempt if it fired in the handler; this records it if it
        # fired around it (the outcome write: refused if that was committed).
        # Then django-q2 replaces this worker process.
        close_old_connections()
        hard_timeout_outside(job, token)
        raise
    keep_connection()
    return outcome


class Chain:
    """The jobs a worker process runs itself after a package's first one: which
    kinds it may take next, and the next job when it was claimed together with
    the outcome of the last one (``services.NextClaim``, asked for by the
    runner as a job completes).

    The chain stops, returning to django-q2, when no job is ready, when a
    package waits in this cluster's queue (reserved jobs and plain tasks go
    first), after ``WORKER_CHAIN_SECONDS`` (django-q2 then gets its turn:
    shutdown, recycling), and it only takes kinds whose hard limit fits in what
    is left of the django-q2 hard limit armed for this task (``hard_deadline``),
    so django-q2 never kills a job that jobstate's own timeout would have stopped.
    """

    def __init__(self, me: str, hard_deadline: float, started: float) -> None:
        self.me, self.hard_deadline, self.started = me, hard_deadline, started
        # The job whose handler runs (or ran last) and when it started: a job this
        # process begins after that is the one whose handler has not started yet.
        self.running: Any = None
        self.since = timezone.now()
        self.seconds = float(conf.get("WORKER_CHAIN_SECONDS") or 0)
        self.request: services.NextClaim | None = None
        self.asked = 0.0

    def next_kinds(self) -> list[str]:
        """The kinds this process may take next (none: the chain stops here)."""
        now = time.monotonic()
        if self.seconds <= 0 or now - self.started >= self.seconds or not counters.nothing_waiting():
            return []
        left = self.hard_deadline - now - CHAIN_MARGIN
        return sorted(k for k, s in registry.all_handlers().items() if hard_limit_for(s) <= left)

    def __call__(self) -> services.NextClaim | None:
        kinds = self.next_kinds()
        self.request = services.NextClaim(self.me, kinds) if kinds else None
        self.asked = time.monotonic()  # just before the outcome that may claim it
        return self.request

    def handed_over(self) -> tuple[Job | None, bool]:
        """The job claimed with the last outcome, if one was, and whether that
        claim was made (made and empty: no job was ready); ``asked``: when
        (``time.monotonic()``) that outcome's call started."""
        request, self.request = self.request, None
        if request is None or not request.tried:
            return None, False
        return (request.claimed[0] if request.claimed else None), True


def chain(me: str, hard_deadline: float, started: float, links: Chain | None = None) -> int:
    """Run this worker process's next ready jobs itself, one at a time: each one
    claimed with the previous one's outcome where that can be one statement
    (``services.handover``), else claimed and begun in one statement
    (``services.claim(start=True)``); no hand-over through the pusher and
    django-q2's queues between two jobs. Returns how many jobs it ran."""
    links = links or Chain(me, hard_deadline, started)
    ran = 0
    job, tried = links.handed_over()
    leased_at = links.asked
    if tried:  # claimed with the outcome: the database answers
        claims_outage.ended()
    while not tried or job is not None:
        if job is None:
            kinds = links.next_kinds()
            if not kinds:
                break
            leased_at = time.monotonic()
            try:
                claimed = services.claim(links.me, kinds=kinds, limit=1, start=True)
            except DatabaseErrors as exc:  # InterfaceError too: the outcome is stored, the task must not fail
                claims_outage.failed("could not claim a next job; back to django-q2", exc)
                close_old_connections()
                break
            claims_outage.ended()
            if not claimed:
                break
            job = claimed[0]
        # django-q2 armed its hard limit for the package's job; this one gets its own.
        limit = hard_limit_for(registry.all_handlers().get(job.kind))
        q2.rearm_hard_limit(min(limit, links.hard_deadline - time.monotonic()))
        _run_begun(job, links.me, links, leased_at)
        ran += 1
        job, tried = links.handed_over()
        leased_at = links.asked
        if tried:
            claims_outage.ended()
    return ran


def run_by_id(job_id: Any) -> str:
    """Id-only alternative: claim and begin this one job now, and run it."""
    cluster = cluster_id()
    me = worker_id(cluster)
    _serve(me, cluster)
    leased_at, since = time.monotonic(), timezone.now()
    calls = Calls(functools.partial(services.start, job_id, me))
    try:
        job = reconnecting(calls, KEPT_CLOSED)
    except InvalidTransition:
        # Made again on a new connection: the first one may have begun it, unheard.
        held = unheard.begun(job_id, me, since) if calls.made > 1 else None
        if held is None:
            return "skipped"  # cancelled, or run by someone else
        job = held
    except (Job.DoesNotExist, ConcurrencyLimitReached, KindPaused):
        return "skipped"  # gone, or its kind is full or paused (the broker takes it later)
    return _run_begun(job, me, leased_at=leased_at)


def reap() -> dict[str, int]:
    """Scheduled: requeue (or fail) jobs whose worker was lost, and forget the
    processes not seen for a day (killed ones never remove their row: each kept its
    ``jobstate_lease_renewals_total`` series and its line in the admin for good)."""
    report = services.requeue_expired()
    done = {
        "requeued": len(report.requeued),
        "failed": len(report.failed),
        "cancelled": len(report.cancelled),
    }
    if report.more:  # as below: else the result keeps its shape
        done["more"] = 1  # the sweep stopped at its limit: the next one takes the rest
    forgotten = worker_processes.forget_dead()
    if forgotten:  # else the result keeps its shape
        done["dead_processes_forgotten"] = forgotten
    return done


def prune(days: float | None = None) -> dict[str, int]:
    """Scheduled: delete finished jobs older than the retention period, for at most
    ``PRUNE_MAX_SECONDS`` (django-q2's timeout kills a plain task that runs longer,
    mid-batch, every day): ``more`` in the result says the next run has work left."""
    from jobstate.worker.retention import prune as prune_jobs

    return prune_jobs(days, max_seconds=float(conf.get("PRUNE_MAX_SECONDS"))).as_dict()
