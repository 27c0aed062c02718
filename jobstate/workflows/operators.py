"""What operators do to workflows: retry from a chosen step, skip a step.

Both record the actor and the reason in the job's history. A terminal job stays
terminal: a retry is a new job linked to it (``retry_of``) whose earlier steps
are copied, outputs included, so they do not run again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from jobstate import services
from jobstate.exceptions import InvalidTransition
from jobstate.models import Job, JobStep
from jobstate.models.step import STEP_DONE, StepStatus
from jobstate.services.actors import Actor
from jobstate.states import TERMINAL, Status
from jobstate.workflows import step_operators
from jobstate.workflows.definition import Workflow, definition_of


def _workflow(job: Job) -> type[Workflow]:
    cls = definition_of(job.kind)
    if cls is None:
        raise ValidationError({"kind": [f"'{job.kind}' is not a registered workflow."]})
    return cls


def _get(job: Job | Any) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


def resume_point(job: Job | Any) -> str | None:
    """The first step of ``job`` that is neither completed nor skipped (None: all done)."""
    job = _get(job)
    rows = {r.name: r.status for r in JobStep.objects.filter(job_id=job.pk)}
    for spec in _workflow(job).steps:
        if rows.get(spec.name, StepStatus.PENDING) not in STEP_DONE:
            return spec.name
    return None


def retry_from(
    job: Job | Any,
    step: str | None = None,
    *,
    actor: Actor | str | Any | None = None,
    reason: str = "",
    skip: Iterable[str] = (),
) -> Job:
    """Retry a finished workflow from ``step`` (default: where it stopped) as a new
    linked job. Every step before ``step`` must have completed (or been skipped):
    their outputs are reused. Steps in ``skip`` (at or after ``step``) are skipped.
    When every step completed and the job still did not complete (its ``result()``
    raised, say), where it stopped is after its last step: the retry copies them all and
    runs none. A completed job runs again from its first step."""
    if isinstance(skip, str | bytes):  # its characters would be taken as the names
        raise TypeError(f"skip is a list of step names, not a string: skip=[{skip!r}]")
    old = _get(job)
    if old.status not in TERMINAL:
        raise InvalidTransition(old.status, Status.QUEUED, "retry_from")
    cls = _workflow(old)
    names = [s.name for s in cls.steps]
    # A completed job runs again from its first step; one that failed (or was cancelled)
    # after every step completed, from after its last.
    start = step if step is not None else (names[0] if old.status == Status.COMPLETED else resume_point(old))
    skipping = list(dict.fromkeys(skip))
    if start is not None and start not in names:
        raise ValidationError({"step": [f"'{start}' is not a step of {old.kind} ({', '.join(names)})."]})
    unknown = [n for n in skipping if n not in names]
    if unknown:  # not "Only steps from ... can be skipped": no step has that name
        listed = ", ".join(repr(n) for n in unknown)
        raise ValidationError({"skip": [f"{listed}: not a step of {old.kind} ({', '.join(names)})."]})
    first = len(names) if start is None else names.index(start)
    bad = [n for n in skipping if n not in names[first:]]
    if bad:
        if start is None:
            raise ValidationError({"skip": [f"Every step completed: none to skip ({', '.join(bad)})."]})
        raise ValidationError({"skip": [f"Only steps from '{start}' on can be skipped: {', '.join(bad)}."]})
    rows = {r.name: r for r in JobStep.objects.filter(job_id=old.pk)}
    missing = [n for n in names[:first] if n not in rows or rows[n].status not in STEP_DONE]
    if missing:
        raise ValidationError(
            {
                "step": [
                    f"Cannot retry from '{start}': earlier step(s) {', '.join(missing)} did not complete "
                    "(or were undone); retry from the first of them."
                ]
            }
        )
    who = Actor.of(actor)
    why = reason or f"retry of {old.pk} " + (f"from step '{start}'" if start else "after its last step")
    with transaction.atomic():
        new = services.retry(old, who, why)
        step_operators.seed_retry(new, old.pk, rows, names, start, skipping, actor=who, reason=why)
    return new


def skip_step(job: Job | Any, step: str, *, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """Skip a failed (or not yet run) step of a queued workflow job, e.g. one waiting
    for its retry, or of one waiting for its children: when it runs, it goes on after
    that step. A finished job cannot change: use ``retry_from(job, step, skip=[step])``."""
    current = _get(job)
    cls = _workflow(current)
    names = [s.name for s in cls.steps]
    if step not in names:
        raise ValidationError({"step": [f"'{step}' is not a step of {current.kind} ({', '.join(names)})."]})
    step_operators.skip(current, names, step, actor=Actor.of(actor), reason=reason or "skipped by operator")
    return _get(current)
