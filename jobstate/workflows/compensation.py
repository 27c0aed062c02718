"""Saga compensation: when a workflow fails for good, the undos of its completed
steps run in reverse order, each recorded on the step and in the job's history."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobstate.exceptions import LeaseLost
from jobstate.models.step import StepStatus
from jobstate.workflows import steps
from jobstate.workflows.context import StepContext

if TYPE_CHECKING:
    from jobstate.workflows.runtime import Run

logger = logging.getLogger("jobstate")


@dataclass
class Report:
    undone: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.undone or self.failed)

    def message(self, step: str, error: str) -> str:
        parts = [f"step '{step}' failed: {error}"]
        if self.undone:
            parts.append(f"undone: {', '.join(self.undone)}")
        if self.failed:
            parts.append("undo failed: " + ", ".join(f"{name} ({err})" for name, err in self.failed))
        return "; ".join(parts)


def compensate(run: Run, failed_step: str, error: str) -> Report:
    """Run the undo of every completed step that has one, last step first. An undo
    that raises is recorded and the others still run."""
    report = Report()
    because = f"step '{failed_step}' failed: {error}"[:1000]
    for spec in reversed(run.specs):
        row = run.rows.get(spec.name)
        if spec.undo is None or row is None or row.status != StepStatus.COMPLETED:
            continue
        sctx = StepContext(run, spec, row, undoing=True)
        try:
            getattr(run.wf, spec.undo)(sctx, row.output)
        except LeaseLost:
            raise
        except Exception as exc:
            logger.exception("Undo of step '%s' of job %s failed", spec.name, run.job.pk)
            message = f"{type(exc).__name__}: {exc}"
            steps.undo_failed(run.job, run.token, spec.name, message, because=because)
            report.failed.append((spec.name, message))
        else:
            steps.undone(run.job, run.token, spec.name, because=because)
            row.status = StepStatus.UNDONE
            report.undone.append(spec.name)
    return report
