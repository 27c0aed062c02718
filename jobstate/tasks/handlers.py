"""A ``@task`` function as a jobstate handler: its kind registered in jobstate's
registry, each attempt run in a worker (``current()`` inside it), and the
``task_started`` / ``task_finished`` signals sent around it."""

from __future__ import annotations

import contextvars
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from jobstate import registry
from jobstate.models import Job
from jobstate.states import TERMINAL
from jobstate.tasks.compat import (
    InvalidTask,
    Task,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from jobstate.tasks.exceptions import UnstorableResult
from jobstate.tasks.options import kind_of, option
from jobstate.tasks.rebuild import rebuild_task, spec_of
from jobstate.tasks.results import build_result, started_result, with_history
from jobstate.tasks.task_types import JobstateTaskContext

# The ``jobstate.worker.context.JobContext`` a worker passes to handlers. Not
# imported: tasks and worker are sibling layers (issue 11), and the worker passes it in.
JobContext = Any

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("jobstate_task", default=None)


def current() -> JobContext:
    """The ``JobContext`` of the task running in this worker (any task, with or
    without ``takes_context``); ``RuntimeError`` outside one."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("jobstate.tasks.current() is only available while a task runs in a worker")
    return ctx


def register(task: Task[..., Any], queue: str | None = None, *, backend: type[Any]) -> str:
    """Register ``task``'s kind (in ``queue``, default: its own) in jobstate's
    handler registry, once per kind and options; return the kind. ``InvalidTask``
    if the kind belongs to something else. ``backend``: the class of the backend
    registering it, the signals' sender if the task's alias is gone from ``TASKS``."""
    kind = kind_of(task, queue)
    wanted = (
        task.func,
        option(task, "max_attempts"),
        option(task, "timeout"),
        option(task, "concurrency"),
        option(task, "retry_backoff"),
    )
    existing = spec_of(kind)
    if existing is not None:
        held = getattr(existing.func, "jobstate_task", None)
        if held is None or held.func is not task.func:
            raise InvalidTask(
                f"The job kind {kind!r} is already registered for "
                f"{getattr(held, 'module_path', None) or existing.func!r}; give this task its own kind=."
            )
        if getattr(existing.func, "jobstate_options", None) == wanted:
            return kind
    options: dict[str, Any] = {"api": False}  # task kinds are enqueued from code, not through the API
    registry.unregister(kind)
    attempts = option(task, "max_attempts")
    registry.handler(
        kind,
        # A whole float (5.0) is a valid task option; a handler's max_attempts is an int.
        max_attempts=None if attempts is None else int(attempts),
        timeout=option(task, "timeout"),
        concurrency=option(task, "concurrency"),
        retry_backoff=option(task, "retry_backoff"),
        **options,
    )(_handler(task, wanted, backend))
    return kind


def _handler(
    task: Task[..., Any], wanted: tuple[Any, ...], backend: type[Any]
) -> Callable[[JobContext], Any]:
    def run(ctx: JobContext) -> Any:
        return execute(task, ctx, backend)

    run.__module__ = task.func.__module__
    run.__qualname__ = task.func.__qualname__
    run.__name__ = task.func.__name__
    run.__doc__ = task.func.__doc__ or f"Task {task.module_path}"
    run.jobstate_task = task  # type: ignore[attr-defined]
    run.jobstate_options = wanted  # type: ignore[attr-defined]
    return run


def execute(task: Task[..., Any], ctx: JobContext, backend: type[Any]) -> Any:
    """Run one attempt of a task job in a worker: what the registered handler does."""
    parameters = ctx.job.parameters or {}
    args = list(parameters.get("args") or [])
    kwargs = dict(parameters.get("kwargs") or {})
    rebuilt = rebuild_task(task, ctx.job)
    result = started_result(ctx.job, rebuilt)
    sender = backend_class(rebuilt, backend)
    if len(_running) >= RUNNING_LIMIT:  # attempts that lost their lease are never seen to end here
        _running.pop(next(iter(_running)))
    _running[ctx.job.pk] = Attempt(rebuilt, result, sender)
    task_started.send(sender, task_result=result)
    token = _current.set(ctx)
    value: Any
    try:
        if task.takes_context:
            value = task.call(JobstateTaskContext(task_result=result, jobstate=ctx), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    finally:
        _current.reset(token)
    try:
        value = normalize_json(value)
    except (TypeError, ValueError) as exc:
        # A property of the task, not of the attempt: running it again would only
        # repeat its side effects (as for a value the database refuses).
        raise UnstorableResult(f"The task returned a value that is not JSON: {exc}") from exc
    attempt = _running.get(ctx.job.pk)
    if attempt is not None:
        attempt.returned, attempt.value = True, value
    return value


def backend_class(task: Task[..., Any], registered_by: type[Any]) -> type[Any]:
    """The class of the backend ``task`` was enqueued on: the sender of the signals,
    as Django sends them (a subclass of ``JobstateBackend``, say). For an alias no
    longer in ``TASKS`` (its job still runs), the class that registered the kind."""
    try:
        return type(task.get_backend())
    except ImproperlyConfigured:  # InvalidTaskBackend (InvalidTaskBackendError in the backport)
        return registered_by


class Attempt:
    """A task attempt running in this process: what ``task_finished`` needs."""

    __slots__ = ("result", "returned", "sender", "task", "value")

    def __init__(self, task: Task[..., Any], result: Any, sender: type[Any]) -> None:
        self.task, self.result, self.sender = task, result, sender
        self.returned, self.value = False, None


# Task jobs whose attempt runs in this process (for task_finished).
_running: dict[Any, Attempt] = {}
RUNNING_LIMIT = 10_000


def on_transition(change: Any) -> None:
    """``hooks.transitioned`` (inside the transaction): once a task job whose attempt
    ran in this process reaches a final state, send ``task_finished`` after the commit."""
    attempt = _running.pop(change.job_id, None) if _running else None
    if attempt is None:
        return
    if change.to_status not in TERMINAL:
        if change.to_status == "processing":  # still running (a relabel, a cancel request)
            _running[change.job_id] = attempt
        return
    if change.to_status == "completed" and attempt.returned:
        # The common case needs no query: the attempt's start plus what it returned.
        result = dataclasses.replace(
            attempt.result,
            status=TaskResultStatus.SUCCESSFUL,
            finished_at=change.at or timezone.now(),
            errors=list(attempt.result.errors),
            worker_ids=list(attempt.result.worker_ids),
        )
        object.__setattr__(result, "_return_value", stored(attempt.value))
        # robust: a receiver that raises is logged; the committed outcome is the
        # worker's to report, not an error storing it (it would be reported "lost").
        transaction.on_commit(lambda: task_finished.send(attempt.sender, task_result=result), robust=True)
        return

    def send() -> None:
        job = with_history(Job.objects.filter(pk=change.job_id)).first()
        if job is not None:
            task_finished.send(attempt.sender, task_result=build_result(job, attempt.task))

    transaction.on_commit(send, robust=True)


def stored(value: Any) -> Any:
    """``value`` as the database stores it and ``get_result`` reads it back (a dict's
    keys become strings)."""
    return json.loads(json.dumps(value)) if isinstance(value, dict | list) else value
