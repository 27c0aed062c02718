"""Workflows: jobs written as ordered steps that checkpoint, resume after a crash,
fan out to child jobs and back in, and undo completed steps when they fail for good.

``Workflow``, ``step`` and ``workflow`` import nothing from the database layer
(``jobstate`` re-exports them); the rest loads on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from jobstate.workflows.definition import StepSpec, Workflow, definition_of, step
from jobstate.workflows.registration import workflow

_LAZY = {
    "state": "jobstate.workflows.snapshot",
    "retry_from": "jobstate.workflows.operators",
    "skip_step": "jobstate.workflows.operators",
    "resume_point": "jobstate.workflows.operators",
    "StepContext": "jobstate.workflows.context",
    "WorkflowFailed": "jobstate.workflows.runtime",
    "ChildrenFailed": "jobstate.workflows.fanout",
    "StepStateError": "jobstate.workflows.steps",
}

__all__ = ["StepSpec", "Workflow", "definition_of", "install", "step", "workflow", *_LAZY]


def install() -> None:
    """Register the workflows' answers to the core's hooks (``JobstateConfig.ready``):
    the reaper's plan for a workflow job, a cancelled workflow's run for its undos,
    and a waiting workflow's progress."""
    from jobstate import hooks
    from jobstate.workflows import fanout, recovery

    hooks.reaping.register(recovery.reaping)
    hooks.cancelling.register(recovery.cancelling)
    hooks.waiting_progress.register(fanout.waiting_progress)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jobstate.workflows' has no attribute {name!r}")
