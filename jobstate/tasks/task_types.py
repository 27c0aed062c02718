"""``JobstateTask`` and ``JobstateTaskContext``: Django's ``Task`` and ``TaskContext``
with jobstate's options and the running job's context."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from jobstate.tasks.compat import Task, TaskContext

P = ParamSpec("P")
T = TypeVar("T")


if TYPE_CHECKING:
    _GenericTask = Task
else:
    # Django 6's Task is generic in the stubs only (the backport's at runtime too):
    # Generic makes JobstateTask[P, T] valid at runtime on both.
    class _GenericTask(Task, Generic[P, T]):
        __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobstateTask(_GenericTask[P, T]):
    """A ``Task`` with jobstate's per-task options (``@task(max_attempts=5, ...)``).

    ``kind``: the job kind (default: the function's module path). ``max_attempts``,
    ``timeout`` (seconds per attempt), ``concurrency`` (running at once, across
    every worker), ``retry_backoff`` (seconds, or a callable attempt -> seconds):
    as for ``@jobstate.handler``. ``key``: an idempotency key, a string or a
    callable receiving the task's arguments; while a job with that key is active,
    enqueueing returns it instead of a new one. ``owner``: the user the job
    belongs to (set per call with ``.using(owner=user)``).
    """

    kind: str | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    concurrency: int | None = None
    retry_backoff: Any = None
    key: Any = None
    owner: Any = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        owner: Any = None,
        key: Any = None,
    ) -> JobstateTask[P, T]:
        changes: dict[str, Any] = {}
        for name, value in (
            ("priority", priority),
            ("queue_name", queue_name),
            ("run_after", run_after),
            ("backend", backend),
            ("owner", owner),
            ("key", key),
        ):
            if value is not None:
                changes[name] = value
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobstateTaskContext(TaskContext):  # type: ignore[type-arg, misc]  # generic, and not frozen, in the stubs only
    """Django's ``TaskContext`` plus ``jobstate``: the running job's ``JobContext``
    (``progress()``, ``heartbeat()``, ``add_asset()``, ``check_cancelled()``, ``job``)."""

    jobstate: Any
