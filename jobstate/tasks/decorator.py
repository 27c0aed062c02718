"""``jobstate.tasks.task``: Django's ``@task`` with jobstate's options, typed.

Django's own decorator passes extra keyword arguments on to the backend's task
class, so ``@task(max_attempts=5)`` works at runtime, but type checkers read
Django's signature and reject it (and ``.using(owner=..., key=...)``). This one
takes the same arguments plus jobstate's, and returns a ``JobstateTask``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from jobstate.tasks import compat
from jobstate.tasks.task_types import JobstateTask, JobstateTaskContext

P = ParamSpec("P")
T = TypeVar("T")
Backoff = float | Callable[[int], float]
Key = str | Callable[..., str]


@overload
def task(function: Callable[P, T], /) -> JobstateTask[P, T]: ...


@overload
def task(
    *,
    priority: int | None = None,
    queue_name: str | None = None,
    backend: str | None = None,
    takes_context: Literal[False] = False,
    kind: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    retry_backoff: Backoff | None = None,
    key: Key | None = None,
) -> Callable[[Callable[P, T]], JobstateTask[P, T]]: ...


@overload
def task(
    *,
    priority: int | None = None,
    queue_name: str | None = None,
    backend: str | None = None,
    takes_context: Literal[True],
    kind: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    retry_backoff: Backoff | None = None,
    key: Key | None = None,
) -> Callable[[Callable[Concatenate[JobstateTaskContext, P], T]], JobstateTask[P, T]]: ...


def task(function: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``@task`` or ``@task(max_attempts=5, key=..., ...)``: the options of Django's
    ``@task`` (``priority``, ``queue_name``, ``backend``, ``takes_context``) and
    jobstate's (``kind``, ``max_attempts``, ``timeout``, ``concurrency``,
    ``retry_backoff``, ``key``), validated as Django's decorator validates them.
    An option left at None keeps its default. ``InvalidTask`` for a backend that
    is not jobstate's."""
    given = {name: value for name, value in options.items() if value is not None}
    alias = given.get("backend", compat.DEFAULT_TASK_BACKEND_ALIAS)
    backend = compat.task_backends[alias]
    if not issubclass(backend.task_class, JobstateTask):
        # Its tasks take none of jobstate's options nor .using(owner=...), which
        # this decorator's type promises (Django's own @task suits that backend).
        raise compat.InvalidTask(
            f"jobstate.tasks.task needs a jobstate backend; {alias!r} is "
            f"{type(backend).__module__}.{type(backend).__qualname__}."
        )
    if function is not None:
        return compat.task(function, **given)
    return compat.task(**given)
