"""A handler that does not honour its interrupt (it swallows ``Interrupted``, or
is stuck where a signal cannot reach it): the worker process gives it up.

``JOBSTATE["INTERRUPT_GRACE_SECONDS"]`` after the watchdog interrupted it (timeout,
cancel grace over, lease lost), with the handler still running, the watchdog:

- marks the job given up, so that the heartbeat renews its lease no more;
- records the outcome the interrupt stands for (``endings.finish``, guarded by the
  lease token: a timeout is retried or ``failed`` Timeout, a cancel ``cancelled``,
  a lost lease nothing), on a thread of its own waited for a heartbeat interval at
  most (``connections.on_own_thread``): the watchdog itself never waits on the
  database;
- logs one ERROR line naming the job, its handler and what happened;
- in a django-q2 worker process, ends the process (``os._exit``): django-q2
  replaces it, or, while the cluster stops, lets the stop finish (it waits for its
  worker processes without a limit). Inline (``drain``, tests, scripts) the process
  goes on: the handler still runs, and its outcome, when it returns, is discarded.

Without this, the heartbeat renewed such a handler's lease for ever: the job ended
only with django-q2's hard time limit (as ``WorkerLost``, by the reaper, the
timeout recorded nowhere), and a cluster stopping waited for it for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from jobstate import conf, hooks
from jobstate.worker.connections import on_own_thread
from jobstate.worker.endings import finish
from jobstate.worker.slot import Slot

logger = logging.getLogger("jobstate")

# The exit status of a worker process that gave its handler up.
GIVEN_UP_EXIT = 70

WHY = {
    "timeout": "its timeout",
    "cancel": "the cancel grace period",
    "lease": "the loss of its lease",
}


def grace() -> float:
    """Seconds a handler has to honour its interrupt before it is given up."""
    return float(conf.get("INTERRUPT_GRACE_SECONDS"))


def give_up(slot: Slot) -> None:
    """Give up the handler of ``slot`` (the watchdog's thread calls this)."""
    with slot.ending:
        if slot.done.is_set() or slot.given_up or slot.interrupted is None:
            return
        slot.given_up = True  # from now on the heartbeat leaves it alone
    try:
        slot.recorded = _record(slot)
        slot.ctx.lease_lost.set()  # the job is no longer this process's: ctx.progress says so
        _log(slot)
        if slot.ends_process:
            with slot.ending:
                if not slot.done.is_set():  # else it returned meanwhile: its process goes on
                    _before_exit(slot)
                    os._exit(GIVEN_UP_EXIT)
    finally:
        slot.escalated.set()


def _before_exit(slot: Slot) -> None:
    """What ``run_job``'s ending would have done, which ``os._exit`` skips: the
    ``attempt_ended`` hook told (once: the handler's thread never gets there), and
    every logging handler flushed (the ERROR line above to a log shipper)."""
    try:
        hooks.attempt_ended(slot.ctx, slot.recorded or "lost")
    except Exception:
        logger.exception("jobstate: a function of the attempt_ended hook raised; ignored")
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for each in loggers:
        for handler in getattr(each, "handlers", ()):
            with contextlib.suppress(Exception):
                handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _record(slot: Slot) -> str | None:
    """The interrupt's outcome, recorded on a thread of its own: what was stored
    ("lost" for a lost lease, or a refused write), None if it did not answer in time."""
    why = slot.interrupted
    if why is None or why == "lease":
        return "lost"  # someone else holds the job: nothing to write
    done: list[str] = []

    wait = float(conf.get("HEARTBEAT_SECONDS"))

    def record() -> None:
        try:
            # Tried again no longer than it is waited for: a late write would
            # contradict the log line that says it was not recorded in time.
            done.append(finish(slot.ctx, "interrupted", why, within=wait / 2))
        except Exception:
            logger.exception(
                "Job %s: the outcome of its given-up handler could not be stored", slot.ctx.job.pk
            )

    if not on_own_thread(record, name="jobstate-escalation", seconds=wait):
        return None
    return done[0] if done else "lost"


def _log(slot: Slot) -> None:
    ctx, recorded = slot.ctx, slot.recorded
    if slot.interrupted == "lease":
        stored = "nothing recorded (another holder owns the job)"
    elif recorded is None:
        stored = "its outcome not recorded in time (the reaper takes the job once its lease runs out)"
    elif recorded == "lost":
        stored = "its outcome not recorded (the lease was lost, or the write failed)"
    else:
        stored = f"recorded {recorded}"
    then = (
        "this worker process ends (django-q2 starts another)"
        if slot.ends_process
        else "the handler is still running in this process"
    )
    func = ctx.spec.func
    handler = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
    logger.error(
        "Job %s (%s, handler %s) did not stop within %g s of its interrupt (%s): given up, its lease "
        "no longer renewed, %s; %s",
        ctx.job.pk,
        ctx.job.kind,
        handler,
        grace(),
        WHY.get(slot.interrupted or "", slot.interrupted),
        stored,
        then,
        extra={"job_id": str(ctx.job.pk), "kind": ctx.job.kind, "outcome": recorded or "unrecorded"},
    )
