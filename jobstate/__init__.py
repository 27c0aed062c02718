"""jobstate: durable background jobs with a validated lifecycle for Django."""

from jobstate.exceptions import (
    CancelRequested,
    InvalidParameters,
    InvalidTransition,
    LeaseLost,
    NonRetryable,
    Partial,
    UnknownKind,
)
from jobstate.registry import handler
from jobstate.workflows.definition import Workflow, step
from jobstate.workflows.registration import workflow

__all__ = [
    "CancelRequested",
    "InvalidParameters",
    "InvalidTransition",
    "LeaseLost",
    "NonRetryable",
    "Partial",
    "UnknownKind",
    "Workflow",
    "handler",
    "step",
    "workflow",
]
__version__ = "0.1.0"
