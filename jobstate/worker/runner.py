"""Run a job a worker holds to a final, recorded outcome.

A cluster *reserves* jobs (``services.claim``); the worker process that runs
one first *begins* it (``services.begin``: ``started_at`` set, the attempt
charged), then calls the handler in the calling thread.

Each worker process has one **heartbeat** thread and one **watchdog** thread,
started once (not per job):

- the heartbeat (database work) renews the current job's lease every
  ``HEARTBEAT_SECONDS``, notices cancel and stop requests and lease loss,
  writes coalesced progress when it is due, and records the process in
  ``WorkerProcess`` (``services.workers.beat``), busy or idle;
- the watchdog (no database call, so nothing can block it) interrupts the
  handler when it overruns its timeout, ignores a cancel past the grace
  period, or lost its lease: a ``BaseException`` raised through a signal in
  the handler's frames only (a handler's ``except Exception`` cannot swallow
  it; one that lands once the handler returned is ignored: its outcome stands),
  and gives up a handler that has not honoured its interrupt
  ``INTERRUPT_GRACE_SECONDS`` later (``jobstate.worker.escalation``).

An interrupt can land in the middle of a database call; the connection is then
closed and replaced before the outcome is written, so the next job on this
worker process always starts on a clean connection.

How an attempt can end (each has a test in tests/test_runner.py,
tests/test_worker_broker.py or tests/test_kind_pause.py; docs/explanation/attempts.md
explains them):

=========================================  ==========================================
exit                                       recorded outcome
=========================================  ==========================================
handler returns a storable result          ``completed`` (pending progress stored)
handler returns an unstorable result       ``failed`` UnstorableResult, never re-run
handler leaves its transaction open        ``failed`` TransactionLeftOpen (rolled back),
                                           never re-run
``Partial`` with an unstorable result      ``failed`` UnstorableResult, never re-run
``Partial``                                ``partial``
handler raises                             retry (``queued``) or ``failed``, traceback
(``asyncio.CancelledError`` included)
handler raises SystemExit,                 the same, then it is raised on
KeyboardInterrupt or GeneratorExit         (django-q2's hard limit: see below)
KeyboardInterrupt in an inline run         ``queued``, attempt refunded, pending progress
(``drain``, ``run_next``, django-q2's      stored (the operator's Ctrl-C stopped the run),
``sync`` mode: Ctrl-C), in the handler,    then it is raised on; an outcome already
``begin`` or the outcome write             committed stays (and is what
                                           ``attempt_ended`` is told)
the same in ``run_next``'s claim           held until the claim returns, then the
                                           same (a second Ctrl-C: at once, a job
                                           claimed left to the reaper)
``NonRetryable``                           ``failed``
``CancelRequested`` / cancel + any error   ``cancelled`` (pending progress stored)
``Suspend``                                ``queued`` (waiting), attempt refunded
interrupt: timeout                         retry or ``failed`` Timeout (``cancelled``
                                           if a cancel was requested)
interrupt: cancel grace over               ``cancelled``
interrupt / refusal: lease lost            nothing written (another holder owns it)
an interrupt not honoured within           given up: its lease no longer renewed,
``INTERRUPT_GRACE_SECONDS`` (swallowed,    the interrupt's outcome (as above)
or the handler stuck where no signal       recorded from the watchdog, one ERROR
lands)                                     line; a django-q2 worker process then
                                           ends (replaced); inline, the handler runs
                                           on, its own outcome discarded
connection dropped while the handler ran   the outcome written once more on a new
                                           connection (lease token guarded)
the database does not answer at the        tried again while the lease holds; then
outcome write (restart, server down)       the reaper (below)
the outcome write itself fails             connection replaced; the attempt recorded
                                           failed with that error (retry policy)
error before the handler starts            requeued (or ``cancelled``), the error
(begin fails)                              recorded, no attempt charged; past
                                           ``SETUP_FAILURES_REFUNDED`` in a row,
                                           charged: retry or ``failed``
the same after begin: the call's set-up    the same (the attempt refunded, or kept)
an ``attempt_started`` function's (or the  retry or ``failed``, the attempt charged;
set-up's) SystemExit, KeyboardInterrupt,   Ctrl-C in an inline run handed back;
GeneratorExit or CancelledError            django-q2's hard limit ``HardTimeout``;
                                           raised on, the slot ended,
                                           ``attempt_ended`` told
cancel requested before it started         ``cancelled``, no attempt charged
kind paused before it started (reserved    ``queued`` (handed back by ``begin``), no
before the pause)                          attempt charged; runs once resumed
unknown kind                               ``failed`` UnknownKind, no attempt charged
                                           (``cancelled`` if a cancel was requested)
django-q2 hard time limit                  retry or ``failed`` HardTimeout (pending
                                           progress stored)
worker process killed or frozen (or one    the reaper: retry or ``failed`` WorkerLost
whose given-up outcome could not be
written in time)
cluster killed before a process began it   the reaper: ``queued``, no attempt charged
even recording the failure fails           the lease runs out; the reaper, as above
an attempt observer hook raises            logged and ignored; the outcome stands
=========================================  ==========================================
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from datetime import datetime
from typing import Any

from django.db import Error as DatabaseErrors

from jobstate import conf, hooks, registry, services
from jobstate.exceptions import (
    Interrupted,
    KindPaused,
    LeaseLost,
)
from jobstate.models import Job
from jobstate.registry import HandlerSpec
from jobstate.services.claiming import kind_names
from jobstate.worker.connections import close_quietly, usable_connection
from jobstate.worker.context import JobContext, lease_token
from jobstate.worker.ctrl_c import ctrl_c_held
from jobstate.worker.endings import NextRequest, finish, hard_timeout
from jobstate.worker.left_open import TransactionLeftOpen, roll_back_left_open, transaction_state
from jobstate.worker.limits import hard_limit_for, timeout_for
from jobstate.worker.q2 import TimeoutException
from jobstate.worker.slot import HandlerCall, Slot
from jobstate.worker.supervisor import Supervisor, install_signal, supervisor
from jobstate.worker.unstarted import (
    cancel_unstarted,
    hand_back_stopped,
    paused_unstarted,
    release,
    unknown_kind,
)

logger = logging.getLogger("jobstate")

__all__ = ["drain", "hard_limit_for", "run_job", "run_next", "timeout_for"]

# What a handler may raise that is no Exception: recorded, then raised on.
HANDLER_EXITS = (SystemExit, KeyboardInterrupt, GeneratorExit)


def run_job(
    job: Job,
    worker_id: str,
    then: NextRequest | None = None,
    *,
    inline: bool = False,
    leased_at: float | None = None,
) -> str:
    """Run a job this worker holds; return its outcome (completed, partial,
    failed, retrying, cancelled, suspended, lost; paused: its kind was paused
    before it began, handed back to the queue by ``begin``).

    A job only reserved (claimed, ``started_at`` unset) is begun here first
    (``services.begin``: the attempt is charged now); one already begun (by
    ``services.start`` or ``tasks.execute``) runs as it is. ``then``: asked,
    as the job completes, which next job this worker process would claim; it
    may be claimed with the outcome (``services.NextClaim``). ``inline``: run
    by an operator (``drain``, or a task django-q2 runs in ``sync`` mode), whose
    Ctrl-C (``KeyboardInterrupt``) stops the run, not the job: handed back to
    the queue, its attempt refunded, then raised on (in the handler, ``begin``
    or the outcome write). A django-q2 worker process ignores SIGINT: a
    KeyboardInterrupt there is the handler's own, recorded as its error.
    ``leased_at``: when (``time.monotonic()``) the call that began a begun job
    started, from which its watchdog counts the lease (None: now).
    """
    spec = registry.all_handlers().get(job.kind)
    if spec is None:
        return unknown_kind(job)
    if job.started_at is None:
        token = lease_token(job)
        leased_at = time.monotonic()
        try:
            begun = services.begin(job, token, worker_id)
        except LeaseLost:
            logger.info("Job %s was taken from this worker before it started", job.pk)
            return "lost"
        except KindPaused as paused:
            return paused_unstarted(job.pk, paused)
        except Exception as exc:
            job.worker_id = worker_id
            release(job, exc, "the worker could not start the job", refund=True)
            raise
        except KeyboardInterrupt:
            if inline:  # begun or not: the hand-back refunds only a charged attempt
                job.worker_id = worker_id
                hand_back_stopped(job, token)
            raise
        job.worker_id = worker_id
        if begun.cancel_requested:
            return cancel_unstarted(job)
        _copy_row(begun.job, job)
    return _run(job, spec, worker_id, then, inline, leased_at)


def _copy_row(source: Job, target: Job) -> None:
    """The caller's Job object takes the values ``begin`` stored (not its status:
    it stays processing, and django-fsm protects the field)."""
    for field in Job._meta.concrete_fields:
        if field.name != "status":
            setattr(target, field.attname, getattr(source, field.attname))


def _run(
    job: Job,
    spec: HandlerSpec,
    worker_id: str,
    then: NextRequest | None,
    inline: bool,
    leased_at: float | None,
) -> str:
    interruptible = threading.current_thread() is threading.main_thread()
    sup: Supervisor | None = None
    slot: Slot | None = None
    ctx: JobContext | None = None
    observed = False  # attempt_started was called: attempt_ended is owed
    ended = "lost"  # what attempt_ended is told if nothing says otherwise
    try:
        try:
            sup = supervisor()
            ctx = JobContext(job, spec, worker_id, leased_at)
            slot = Slot(
                ctx, timeout_for(spec), interruptible, ends_process=not inline and _worker_process(sup)
            )
            call = slot.call = HandlerCall(spec.func, slot)
            if interruptible:
                install_signal()
            sup.begin(slot)
            started = time.monotonic()
            observed = True
            _observe(hooks.attempt_started, ctx)
            before = transaction_state()
        except BaseException as exc:
            if sup is not None and slot is not None:
                sup.end(slot)
            ended = _unstarted(job, ctx, exc, inline)
            raise
        outcome: tuple[str, Any]
        left_open = False
        try:
            try:
                outcome = ("ok", call(ctx))
            finally:
                sup.end(slot)  # from here on, a late interrupt is ignored
                left_open = roll_back_left_open(before)
        except Interrupted as exc:
            outcome = ("interrupted", exc.why)
        except (Exception, asyncio.CancelledError) as exc:
            # CancelledError (a BaseException) is an async handler's own error: a coroutine
            # it awaited was cancelled; the worker process is not exiting.
            # A database error raised because the interrupt broke what the handler
            # was doing (say, a transaction's rollback on a connection left
            # mid-query) is the interrupt's doing: record the interrupt.
            broken = slot.delivered and isinstance(exc, DatabaseErrors)
            outcome = ("interrupted", slot.interrupted) if broken else ("error", exc)
        except BaseException as exc:
            if slot.given_up:  # its outcome recorded already
                ended = _given_up(slot)
                raise
            # The connection may be mid-query. django-q2's hard time limit
            # (TimeoutException, a SystemExit): recorded as HardTimeout. The handler's
            # own SystemExit, KeyboardInterrupt or GeneratorExit is recorded here as
            # its error, then goes on up (the process may exit): else the job would
            # wait for the reaper, its error lost. Any other: the process is dying.
            close_quietly()
            recorded = isinstance(exc, HANDLER_EXITS) and not isinstance(exc, TimeoutException)
            if inline and isinstance(exc, KeyboardInterrupt):
                ended = hand_back_stopped(job, ctx.token, ctx)
            elif isinstance(exc, TimeoutException):
                ended = hard_timeout(ctx)  # here, while the pending progress is at hand
            elif recorded:
                ended = finish(ctx, "error", exc)
            raise
        if slot.given_up:
            ended = _given_up(slot)
            return ended
        if left_open and outcome[0] == "ok":
            left = TransactionLeftOpen("The handler returned inside a transaction it never ended")
            outcome = ("error", left)
        if slot.delivered:
            close_quietly()  # the interrupt may have left it mid-command
        else:
            usable_connection(time.monotonic() - started)
        try:
            ended = finish(ctx, outcome[0], outcome[1], then=then)
        except KeyboardInterrupt:
            if not inline:
                raise  # its outcome left to the caller, or else the reaper: "lost"
            # Handed back unless the outcome was committed (the token no longer holds it).
            ended = hand_back_stopped(job, ctx.token, ctx)
            raise
        return ended
    finally:
        # Whatever was raised, wherever (set-up, a hook, the outcome write, even an
        # ending's own write): the heartbeat and watchdog stop watching this job, and
        # an attempt_started function that opened something (a span) hears it ended.
        if sup is not None and slot is not None and not slot.done.is_set():
            sup.end(slot)
        if observed:
            _observe(hooks.attempt_ended, ctx, ended)


def _worker_process(sup: Supervisor) -> bool:
    """Whether this is a django-q2 worker process running cluster jobs (a child
    process serving a cluster), which ends if its handler is given up."""
    return sup.identity is not None and multiprocessing.parent_process() is not None


def _given_up(slot: Slot) -> str:
    """The handler returned (or raised) after the watchdog gave it up
    (``jobstate.worker.escalation``), which recorded the outcome its interrupt
    stands for: that is waited for (it is bounded), then the handler's own is
    discarded."""
    slot.escalated.wait(2 * float(conf.get("HEARTBEAT_SECONDS")))
    close_quietly()  # the interrupt may have left it mid-command
    return slot.recorded or "lost"


def _unstarted(job: Job, ctx: JobContext | None, exc: BaseException, inline: bool) -> str:
    """Something raised once ``begin`` charged the attempt, before the handler was
    called (its call's set-up, an ``attempt_started`` function, django-q2's hard
    time limit): the attempt ends as it would have in the handler's frames, except
    that an ``Exception`` refunds it, as a failed ``begin`` would (but past
    ``JOBSTATE["SETUP_FAILURES_REFUNDED"]`` in a row: ``release``). Any other
    (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, ``CancelledError``)
    is charged, as the handler's own exit is: it may end the worker process each
    time, and only a charged attempt lets ``max_attempts`` stop that."""
    if isinstance(exc, Exception):
        return release(job, exc, "the handler could not be started", refund=True)
    close_quietly()  # raised through a signal, maybe mid-query
    if inline and isinstance(exc, KeyboardInterrupt):
        return hand_back_stopped(job, lease_token(job), ctx)
    if isinstance(exc, TimeoutException):
        # Before its context existed, the task records it (tasks._run_begun).
        return hard_timeout(ctx) if ctx is not None else "lost"
    return release(job, exc, "the handler could not be started")


def _observe(hook: hooks.Hook[...], *args: Any) -> None:
    """Call an observer hook (tracing, metrics): one that raises is logged, and
    the attempt goes on as if it had not been there."""
    try:
        hook(*args)
    except Exception:
        logger.exception("jobstate: a function of the %s hook raised; ignored", hook.name)


def run_next(worker_id: str, kinds: list[str] | None = None, *, now: datetime | None = None) -> Job | None:
    """Claim one ready job and run it inline. Returns the job, or None if none was ready.
    ``now``: claim as if the clock read that time (a job is ready once its
    ``run_after`` is at most ``now``; the claim is recorded at it), so that a test
    can run a retry or a ``Suspend(until=...)`` before its time.
    Ctrl-C (``KeyboardInterrupt``) hands the job back to the queue, its attempt
    refunded, and is raised on (``run_job``'s ``inline``). During the claim it is
    held until the claim returns (``ctrl_c_held``; a second one lands at once,
    leaving a job it claimed to the reaper), then the job is handed back by the
    lease token the claim returned."""
    claimed: list[Job] = []
    try:
        with ctrl_c_held():
            claimed = services.claim(worker_id, kinds=kinds, limit=1, now=now)
    except KeyboardInterrupt:
        for job in claimed:
            hand_back_stopped(job, lease_token(job))
        raise
    if not claimed:
        return None
    run_job(claimed[0], worker_id, inline=True)
    return claimed[0]


def drain(
    worker_id: str = "inline",
    kinds: list[str] | None = None,
    max_jobs: int = 1000,
    *,
    now: datetime | None = None,
) -> int:
    """Run ready jobs inline until none is ready (tests, scripts). Returns how many ran.
    ``kinds`` is a list of kind names (None: every kind); a string is a ``TypeError``.
    ``now``: as ``run_next`` takes it (jobs due by then are ready)."""
    kinds = kind_names(kinds)
    count = 0
    while count < max_jobs and run_next(worker_id, kinds, now=now) is not None:
        count += 1
    return count
