"""What the reaper does with a workflow whose worker was lost.

Undos run in a worker, so a workflow that still has work for one gets one more
run instead of ending "worker lost", **without spending an attempt** (the
requeue takes one back, the claim spends it again: ``attempts`` never exceeds
``max_attempts``):

- ``compensate``: compensation had begun (a step carries the ``compensating``
  mark), whatever the attempt; or, on the last attempt, a completed step has an
  undo to run. Then the step where the worker was lost (or the next one to run)
  is failed for good with "worker lost", in the same transaction as the requeue.
- ``finish``: on the last attempt, every step had completed (the worker died
  before storing the job's outcome): the run stores it, running no step.
- ``wait``: whatever the attempt, a fan-out step had started its children and was
  waiting for them (the worker died before giving the job back): the run waits
  for them (or fans in), as the lost one would have, and starts no child again.
  The fan-out decided the run's outcome (waiting spends no attempt), so the lost
  worker costs none either; once ``RECOVERY_RUNS`` are used, a job with attempts
  left spends one instead (the usual rule), so a run that keeps dying there ends.

Each such requeue is a ``requeue`` event with ``recovery`` in its metadata; after
``RECOVERY_RUNS`` of them the reaper fails the job, so an undo that keeps killing
its worker cannot loop forever. A cancel requested before compensation began
still wins (the job ends ``cancelled``, as for any job), unless the workflow has
``undo_on_cancel`` and undos to run: then ``compensate`` too (that run ends it
``cancelled``). ``cancelling`` gives a queued or waiting one such a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobstate import hooks
from jobstate.models import JobEvent, JobStep
from jobstate.models.step import STEP_DONE, StepStatus
from jobstate.services.actors import Actor
from jobstate.workflows import compensation, steps
from jobstate.workflows.definition import Workflow, definition_of, undoes_on_cancel

RECOVERY_RUNS = 3
LOST = "worker lost"
UNDO_ON_CANCEL = "cancel requested: its undos run first"


@dataclass(frozen=True)
class Plan:
    action: str  # "compensate", "finish" or "wait": requeue for one more run; "": fail now
    reason: str = ""  # of the requeue, in the job's history
    error: str = ""  # the job's error when it fails now
    lost_step: str | None = None  # failed for good by the requeue
    steps: tuple[str, ...] = ()  # the workflow's steps, in order (a deploy may have added some)

    @property
    def run(self) -> bool:
        return bool(self.action)


def plan(job_id: Any, kind: str, *, last: bool, cancelling: bool) -> Plan | None:
    """The plan for an expired workflow job; None: the reaper's usual rule applies
    (requeue with attempts left, ``cancelled`` on a cancel, else "worker lost")."""
    cls = definition_of(kind)
    if cls is None:
        return None
    rows = {r.name: r for r in JobStep.objects.filter(job_id=job_id)}
    failing = compensation.under_way(cls.steps, rows)
    lost_step = None
    if failing is not None:
        action, reason = "compensate", "compensating"
        summary = compensation.report_of(cls.steps, rows).message(*failing)
    elif cancelling and _undoes_on_cancel(kind, cls, rows):
        action, reason, summary = "compensate", UNDO_ON_CANCEL, f"cancel requested; {LOST}"
    elif cancelling or not rows:
        return None
    else:
        todo = [s.name for s in cls.steps if getattr(rows.get(s.name), "status", None) not in STEP_DONE]
        if todo and getattr(rows.get(todo[0]), "status", None) == StepStatus.WAITING:
            # Its fan-out committed (children started, the step waiting) and the worker
            # died before giving the job back: the run waits for them, as it would have.
            action = "wait"
            reason = f"{'last attempt, ' if last else ''}its children started: waiting for them"
            summary = f"step '{todo[0]}' waits for its child jobs; {LOST}"
        elif not last:
            return None
        elif not todo:
            action, reason, summary = "finish", "last attempt, every step done: finishing", LOST
        elif compensation.undos_left(cls.steps, rows):
            action, reason, lost_step = "compensate", "last attempt: compensating", todo[0]
            summary = f"step '{lost_step}' failed: {LOST}"
        else:
            return None
    # The reaper's own runs: an operator's requeue of a hung one ("operator") is not one.
    runs = (
        JobEvent.objects.filter(job_id=job_id, transition="requeue", metadata__has_key="recovery")
        .exclude(metadata__has_key="operator")
        .count()
    )
    if runs >= RECOVERY_RUNS:
        if action == "wait" and not last:
            return None  # attempts left: spend one, as for any lost worker
        return Plan("", error=f"{LOST} again after {runs} recovery runs; {summary}")
    return Plan(action, reason, lost_step=lost_step, steps=tuple(s.name for s in cls.steps))


def _undoes_on_cancel(kind: str, cls: type[Workflow], rows: dict[str, Any]) -> bool:
    """Whether a cancel of the job runs undos first: its workflow has ``undo_on_cancel``
    and a completed step whose undo has not run."""
    return undoes_on_cancel(kind) and compensation.undos_left(cls.steps, rows)


def cancelling(asked: hooks.Cancelling) -> str | None:
    """The ``hooks.cancelling`` answer (registered by ``install``): a queued or
    waiting workflow with ``undo_on_cancel`` and undos to run gets a run for them."""
    cls = definition_of(asked.kind)
    if cls is None or not undoes_on_cancel(asked.kind):
        return None
    rows = {r.name: r for r in JobStep.objects.filter(job_id=asked.job_id)}
    return UNDO_ON_CANCEL if _undoes_on_cancel(asked.kind, cls, rows) else None


def apply(plan: Plan, job_id: Any, actor: Actor, now: datetime) -> None:
    """Inside the reaper's transaction, after it requeued the job."""
    if plan.lost_step is not None:
        steps.lost(job_id, plan.lost_step, LOST, actor=actor, now=now, names=plan.steps)


def reaping(expired: hooks.Expired) -> hooks.Reaping | None:
    """The ``hooks.reaping`` answer for a workflow job (registered by ``install``)."""
    found = plan(expired.job_id, expired.kind, last=expired.last, cancelling=expired.cancelling)
    if found is None:
        return None
    if not found.run:
        return hooks.Reaping("", error=found.error)

    def then(job_id: Any, actor: Actor, now: datetime) -> None:
        apply(found, job_id, actor, now)

    return hooks.Reaping(found.action, reason=found.reason, then=then)
