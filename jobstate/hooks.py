"""Extension points of the core, for jobstate's own higher layers.

The service layer is the one writer of job state and imports nothing above
it. Where a higher layer must act on what the core does (a workflow reacting
to a child's end, a webhook queued when a job finishes, a metric counted), it
registers a plain function here from ``JobstateConfig.ready()``; the core calls
the registered functions explicitly, in a known order, inside the transaction
that made the change. Unlike a Django signal, a hook is part of the
transaction: if it raises, the change is rolled back with it.

Integrators who only want to be told after the fact use
``jobstate.signals.job_transitioned`` (sent after commit) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Hook(Generic[P]):
    """An ordered list of functions with one signature, called in turn."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._functions: list[Callable[P, Any]] = []

    def register(self, function: Callable[P, Any]) -> Callable[P, Any]:
        """Add ``function`` (once; registering it again is a no-op). Usable as a decorator."""
        if function not in self._functions:
            self._functions.append(function)
        return function

    def unregister(self, function: Callable[P, Any]) -> None:
        if function in self._functions:
            self._functions.remove(function)

    def __bool__(self) -> bool:
        return bool(self._functions)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for function in list(self._functions):
            function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Hook {self.name}: {len(self._functions)} function(s)>"


class Decision(Hook[P], Generic[P, R]):
    """A hook the core asks for an answer: ``ask()`` returns the first registered
    function's answer that is not None (None when no function has one)."""

    def ask(self, *args: P.args, **kwargs: P.kwargs) -> R | None:
        for function in list(self._functions):
            answer = function(*args, **kwargs)
            if answer is not None:
                return answer  # type: ignore[no-any-return]
        return None


@dataclass(frozen=True)
class Transition:
    """One recorded state change, as hooks see it (the JobEvent's fields)."""

    job_id: Any
    from_status: str
    to_status: str
    transition: str
    actor_label: str
    reason: str
    at: datetime | None


# Called inside the transaction that wrote a job's transition and its history
# row, once per transition (a batched claim calls it once per claimed job).
transitioned: Hook[[Transition]] = Hook("transitioned")


@dataclass(frozen=True)
class Expired:
    """A processing job whose lease expired, as the reaper sees it."""

    job_id: Any
    kind: str
    last: bool  # its last attempt
    cancelling: bool  # a cancel had been requested


@dataclass(frozen=True)
class Reaping:
    """What a higher layer asks the reaper to do with an expired job instead of its
    usual rule. ``action`` non-empty: requeue it for one more run without spending an
    attempt (``reason`` in the history, ``action`` as the event's ``recovery``), then
    call ``then(job_id, actor, now)`` in the same transaction; empty: fail it now with
    ``error``."""

    action: str
    reason: str = ""
    error: str = ""
    then: Callable[[Any, Any, datetime], None] | None = None


# Asked by the reaper (``services.requeue_expired``), inside the transaction that
# will move the expired job; None: the usual rule (requeue, cancel or "worker lost").
# jobstate.workflows answers for workflow jobs (their undos need one more run).
reaping: Decision[[Expired], Reaping] = Decision("reaping")


@dataclass(frozen=True)
class Waiting:
    """A job waiting for its children, one of which just ended; ``active``
    children are still queued or running, their progress summing ``progress``."""

    job_id: Any
    active: int
    progress: int


# Asked, inside a child's final transaction, for the progress (percent, message) a
# waiting parent shows; None leaves the parent's progress alone. jobstate.workflows
# answers for a workflow waiting in a fan-out step.
waiting_progress: Decision[[Waiting], tuple[int, str]] = Decision("waiting_progress")


# Called by the worker runner in the thread that runs a job: ``attempt_started``
# just before the handler is called, ``attempt_ended`` once the attempt's outcome
# is stored (completed, partial, failed, retrying, cancelled, suspended, lost).
# ``ctx`` is the attempt's JobContext. Outside any transaction; functions must not raise.
attempt_started: Hook[[Any]] = Hook("attempt_started")
attempt_ended: Hook[[Any, str]] = Hook("attempt_ended")
