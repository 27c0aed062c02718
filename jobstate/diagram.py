"""The state diagrams, generated from the ``@transition`` declarations of ``Job``
and ``JobStep`` (``python manage.py jobstate_diagram``; docs/explanation/states.md)."""

from __future__ import annotations

from jobstate.models.step import STEP_FINISHED, StepStatus
from jobstate.services.steps import all_step_transitions
from jobstate.services.transitions import all_transitions
from jobstate.states import TERMINAL, Status


def mermaid() -> str:
    """The job state machine."""
    lines = ["stateDiagram-v2", f"    [*] --> {Status.QUEUED.value}: enqueue"]
    for source, target, name in all_transitions():
        lines.append(f"    {source} --> {target}: {name}")
    for status in Status:
        if status in TERMINAL:
            lines.append(f"    {status.value} --> [*]")
    return "\n".join(lines)


def step_mermaid() -> str:
    """The workflow step state machine (``failed`` is final only once compensating)."""
    lines = ["stateDiagram-v2", f"    [*] --> {StepStatus.PENDING.value}"]
    for source, target, name in all_step_transitions():
        lines.append(f"    {source} --> {target}: {name}")
    for status in StepStatus:
        if status in STEP_FINISHED and status != StepStatus.FAILED:
            lines.append(f"    {status.value} --> [*]")
    return "\n".join(lines)
