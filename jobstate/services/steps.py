"""Workflow step transitions: one guarded UPDATE of the step plus one history row.

The allowed moves are the ``@transition`` declarations on ``JobStep`` (read as a
table, like ``Job``'s in ``services.transitions``). A refused move raises
``StepStateError`` and writes nothing. The history row goes to the job's
``JobEvent`` list (the job's own status is unchanged: ``job_status`` on both sides),
with the step, its old and new status in ``metadata``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobstate.exceptions import StepStateError
from jobstate.models import JobStep
from jobstate.services._rows import record_event
from jobstate.services._writes import checked_now
from jobstate.services.actors import Actor

# The history row's ``transition`` for each step transition.
EVENTS = {
    "start": "step_started",
    "serve": "step_serving",
    "wait": "step_waiting",
    "resume_wait": "step_waiting",
    "complete": "step_completed",
    "fail": "step_failed",
    "lose": "step_failed",
    "undo": "step_undone",
    "skip": "skip_step",
}


def _meta(name: str) -> Any:
    meta = getattr(getattr(JobStep, name, None), "_django_fsm", None)
    if meta is None:
        raise ValueError(f"'{name}' is not a JobStep transition")
    return meta


def step_sources(name: str) -> tuple[str, ...]:
    return tuple(str(s) for s in _meta(name).transitions)


def step_target(name: str) -> str:
    (target,) = {str(t.target) for t in _meta(name).transitions.values()}
    return target


def all_step_transitions() -> list[tuple[str, str, str]]:
    """(source, target, name) for every declared step transition."""
    field = JobStep._meta.get_field("status")
    return [(str(t.source), str(t.target), t.name) for t in field.get_all_transitions(JobStep)]


def move_step(
    job_id: Any,
    name: str,
    transition: str,
    *,
    actor: Actor,
    job_status: str,
    fields: dict[str, Any] | None = None,
    reason: str = "",
    metadata: dict[str, Any] | None = None,
    requested: str = "",
    now: datetime | None = None,
) -> str:
    """Apply the declared step transition ``transition`` to step ``name`` of job
    ``job_id`` and record it; returns the status it left. Raises ``StepStateError``
    (nothing written) when the step is missing or not in one of its sources. ``now``
    (None: the clock) is timezone-aware with ``USE_TZ = True``, else ``ValidationError``
    (``_writes.checked_now``), before anything is written."""
    now = checked_now(now) or timezone.now()
    sources, target = step_sources(transition), step_target(transition)
    values: dict[str, Any] = {"status": target, "updated_at": now, **(fields or {})}
    with transaction.atomic():
        row = (
            JobStep.objects.select_for_update()
            .filter(job_id=job_id, name=name)
            .values_list("pk", "status")
            .first()
        )
        current = row[1] if row else None
        if row is None or current not in sources:
            raise StepStateError(job_id, name, requested or transition, current)
        if not JobStep.objects.filter(pk=row[0], status=current).update(**values):
            raise StepStateError(job_id, name, requested or transition, current)
        record_event(
            job_id,
            job_status,
            job_status,
            EVENTS[transition],
            actor,
            reason[:1000],
            {"step": name, "from": current, "to": target, **(metadata or {})},
            now,
        )
    return str(current)


def step_event(
    job_id: Any,
    job_status: str,
    event: str,
    actor: Actor,
    reason: str = "",
    metadata: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """A history row for a step decision that changes no status (an undo that
    failed, a retry seeded from a step). Internal: ``now`` is taken as given (the
    public function that reaches it checks one from its caller)."""
    record_event(job_id, job_status, job_status, event, actor, reason[:1000], metadata, now)
