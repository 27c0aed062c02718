"""The state diagram, generated from the ``@transition`` declarations."""

from __future__ import annotations

from jobstate.services.transitions import all_transitions
from jobstate.states import TERMINAL, Status


def mermaid() -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {Status.QUEUED.value}: enqueue"]
    for source, target, name in all_transitions():
        lines.append(f"    {source} --> {target}: {name}")
    for status in Status:
        if status in TERMINAL:
            lines.append(f"    {status.value} --> [*]")
    return "\n".join(lines)
