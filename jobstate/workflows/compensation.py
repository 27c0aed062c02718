"""Saga compensation: when a workflow fails for good, the undos of its completed
steps run in reverse order, each recorded on the step and in the job's history.

Compensation is resumable: the step that failed for good carries a
``compensating`` mark, written with its ``failed`` status (by the worker, or by
the reaper when the worker was lost on the last attempt). Every later run of the
job sees the mark, runs the undos that are left (an ``undone`` step, or one whose
undo already failed, is not undone again) and fails with the original error.
An undo interrupted by a crash runs again: undos must be idempotent.

A workflow registered with ``undo_on_cancel`` also compensates when cancelled
(``compensate_cancel``): its cancel request is the mark, so a run that finds it
pending runs the undos that are left, then the job ends ``cancelled``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobstate.exceptions import Interrupted, LeaseLost
from jobstate.models.step import StepStatus
from jobstate.storable import exception_text
from jobstate.workflows import step_undos, steps
from jobstate.workflows.context import StepContext

if TYPE_CHECKING:
    from jobstate.workflows.definition import RunState, StepSpec

logger = logging.getLogger("jobstate")
S = StepStatus


@dataclass
class Report:
    undone: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.undone or self.failed)

    def message(self, step: str, error: str) -> str:
        """The job's error: ``step 'ship' failed: <error>; undone: charge, book``."""
        return self._parts(f"step '{step}' failed: {error}")

    def summary(self, step: str) -> str:
        """The job's final progress message: ``step 'ship' failed; undone: charge, book``
        (its error text without the step's error)."""
        return self._parts(f"step '{step}' failed")

    def _parts(self, first: str) -> str:
        parts = [first]
        if self.undone:
            parts.append(f"undone: {', '.join(self.undone)}")
        if self.failed:
            parts.append("undo failed: " + ", ".join(f"{name} ({err})" for name, err in self.failed))
        return "; ".join(parts)


def under_way(specs: Sequence[StepSpec], rows: Mapping[str, Any]) -> tuple[str, str] | None:
    """(step, error) of the step that failed for good, if compensation has begun."""
    for spec in specs:
        row = rows.get(spec.name)
        if row is None:
            continue
        mark = row.detail.get(steps.COMPENSATING)
        if mark:
            return spec.name, str(mark.get("error") or row.error_message or "failed")
    return None


def to_undo(spec: StepSpec, row: Any) -> bool:
    return (
        spec.undo is not None
        and row is not None
        and row.status == S.COMPLETED
        and steps.UNDO_ERROR not in row.detail
    )


def undos_left(specs: Sequence[StepSpec], rows: Mapping[str, Any]) -> bool:
    """Whether a completed step has an undo that has not run (``to_undo``)."""
    return any(to_undo(s, rows.get(s.name)) for s in specs)


def report_of(specs: Sequence[StepSpec], rows: Mapping[str, Any]) -> Report:
    """What compensation did so far, in the order the undos run (last step first)."""
    report = Report()
    for spec in reversed(specs):
        row = rows.get(spec.name)
        if row is None or spec.undo is None:
            continue
        if row.status == S.UNDONE:
            report.undone.append(spec.name)
        elif row.status == S.COMPLETED and steps.UNDO_ERROR in row.detail:
            report.failed.append((spec.name, str(row.detail[steps.UNDO_ERROR])))
    return report


def compensate(run: RunState, failed_step: str, error: str) -> Report:
    """Run the undo of every completed step that has one and was not undone yet,
    last step first. An undo that raises (or is interrupted by the timeout or a
    cancel: the failure is already decided) is recorded and the others still run.
    Then the job's current step and progress message name the failed step again
    (each undo showed its own: "undid book")."""
    report = _undo(run, f"step '{failed_step}' failed: {error}"[:1000])
    if report:
        step_undos.compensated(run.job, run.token, failed_step, report.summary(failed_step))
    return report


def compensate_cancel(run: RunState) -> Report:
    """``compensate`` for a cancel (``undo_on_cancel``): the same undos, recorded the
    same way, because "cancel requested". The job's progress is left as it was (a
    pending cancel refuses progress reports); it then ends ``cancelled``."""
    return _undo(run, CANCEL_REQUESTED)


CANCEL_REQUESTED = "cancel requested"


def _undo(run: RunState, because: str) -> Report:
    for spec in reversed(run.specs):
        row = run.rows.get(spec.name)
        if row is None or spec.undo is None or not to_undo(spec, row):
            continue
        sctx = StepContext(run, spec, row, undoing=True)
        try:
            getattr(run.wf, spec.undo)(sctx, row.output)
        except LeaseLost:
            raise
        except Interrupted as exc:
            if exc.why == "lease":
                raise
            _undo_failed(run, spec.name, row, f"interrupted ({exc.why})", because)
        except Exception as exc:
            logger.exception("Undo of step '%s' of job %s failed", spec.name, run.job.pk)
            _undo_failed(run, spec.name, row, f"{type(exc).__name__}: {exception_text(exc)}", because)
        else:
            step_undos.undone(run.job, run.token, spec.name, because=because)
            row.status = S.UNDONE
    return report_of(run.specs, run.rows)


def _undo_failed(run: RunState, name: str, row: Any, message: str, because: str) -> None:
    step_undos.undo_failed(run.job, run.token, name, message, because=because)
    row.detail = {**row.detail, steps.UNDO_ERROR: message[:2000]}
