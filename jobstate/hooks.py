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

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Hook(Generic[P]):
    """An ordered list of functions with one signature, called in turn.

    A function registered with ``writes`` (a predicate taking the same
    arguments) says for which calls it writes to the database. The core asks
    ``hook.writes(...)`` before a change: when no function writes for it, the
    change may be one autocommitted statement and the functions are called
    right after it (as observers: one that raises is logged, the change stands).
    A function registered without ``writes`` always gets the transaction.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._functions: list[Callable[P, Any]] = []
        self._writes: dict[Callable[P, Any], Callable[P, bool] | None] = {}

    def register(
        self, function: Callable[P, Any], *, writes: Callable[P, bool] | None = None
    ) -> Callable[P, Any]:
        """Add ``function`` (once; registering it again only updates ``writes``).
        Usable as a decorator."""
        if function not in self._functions:
            self._functions.append(function)
        self._writes[function] = writes
        return function

    def unregister(self, function: Callable[P, Any]) -> None:
        if function in self._functions:
            self._functions.remove(function)
            self._writes.pop(function, None)

    def writes(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """Whether some function would write to the database for these arguments."""
        for function in self._functions:
            predicate = self._writes.get(function)
            if predicate is None or predicate(*args, **kwargs):
                return True
        return False

    def __bool__(self) -> bool:
        return bool(self._functions)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for function in list(self._functions):
            function(*args, **kwargs)

    def observe(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every function after the change committed: one that raises is
        logged and the others still run."""
        for function in list(self._functions):
            try:
                function(*args, **kwargs)
            except Exception:
                logging.getLogger("jobstate").exception(
                    "jobstate: a function of the %s hook raised after the change committed; ignored",
                    self.name,
                )

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
# row, once per transition (a batched claim calls it once per claimed job); when
# no function ``writes`` for it, right after that row's statement instead. Asked
# before a claim, the Transition's ``job_id`` is None (the job is not known yet).
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
class Cancelling:
    """A queued or waiting job a cancel was asked of (``services.request_cancel``)."""

    job_id: Any
    kind: str
    status: str


# Asked by ``services.request_cancel``, inside its transaction (the job's row locked),
# of a queued or waiting job (and by ``services.cascade``, of each queued, waiting or
# reserved child of a job that ends failed or cancelled): a reason (for its history)
# to give the job one more run in a worker before it ends ``cancelled``, its cancel
# request stored; None: cancel it at once. jobstate.workflows answers for a workflow
# with ``undo_on_cancel`` whose completed steps have undos to run.
cancelling: Decision[[Cancelling], str] = Decision("cancelling")


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
# is stored (completed, partial, failed, retrying, cancelled, suspended, lost,
# interrupted: an inline run stopped by Ctrl-C, the job handed back, or, when
# its outcome write had committed, that outcome, read from its history row; also
# lost when the attempt is cut short by django-q2's hard time limit or a shutdown
# as its outcome is written, whose outcome the caller, or else the reaper, stores).
# Every attempt ``attempt_started`` was called for gets one ``attempt_ended``, even
# one that an ``attempt_started`` function's SystemExit ended before its handler.
# ``ctx`` is the attempt's JobContext. Outside any transaction; functions must not raise.
attempt_started: Hook[[Any]] = Hook("attempt_started")
attempt_ended: Hook[[Any, str]] = Hook("attempt_ended")


@dataclass(frozen=True)
class HistoryTaken:
    """How far a layer that derives totals from the history rows has read them:
    ``upto``, the highest id taken in; ``more``, settled rows past it were left (its
    deadline passed)."""

    upto: int
    more: bool = False


# Asked by retention before it deletes jobs with their history rows, with that step's
# ``time.monotonic()`` deadline (None: none). jobstate.metrics folds the rows into its
# counters first (a deleted row can never be counted) and answers how far it got;
# retention then keeps every job with a history row past ``upto``, for a later prune.
# None: nothing reads the history (metrics never scraped): no bound.
history_pruning: Decision[[float | None], HistoryTaken] = Decision("history_pruning")

# Asked by a dry-run prune instead: how far ``history_pruning`` would take the rows in if
# asked now with no deadline, without taking anything in (a dry run writes nothing); the
# dry run then counts as kept every job with a history row past ``upto``, as the prune
# keeps it. None: no bound, as for ``history_pruning``.
history_reach: Decision[[], HistoryTaken] = Decision("history_reach")
