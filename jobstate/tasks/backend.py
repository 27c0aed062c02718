"""``JobstateBackend``: Django's tasks framework on jobstate's jobs.

Each ``@task`` function is a jobstate kind (its module path, or the ``kind`` it
gives; tasks of a queue other than "default" get the queue as a prefix:
``"emails:myapp.tasks.send"``). The kind is registered in jobstate's handler
registry the first time the backend validates the task (at decoration), so the
same workers, leases, retries, admin and API serve it. A job stores the call as
``{"args": [...], "kwargs": {...}}``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
import uuid
import warnings
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from jobstate import registry, services
from jobstate.exceptions import UnknownKind
from jobstate.models import Job
from jobstate.states import TERMINAL
from jobstate.storable import json_text
from jobstate.tasks.checks import options_problems
from jobstate.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from jobstate.tasks.exceptions import UnstorableResult
from jobstate.tasks.missing import enqueued_as_task, loaded_task, unavailable
from jobstate.tasks.options import KEY_TEXT, kind_of, option, split_kind, storable_key, validate_options
from jobstate.tasks.results import build_result

# The ``jobstate.worker.context.JobContext`` a worker passes to handlers. Not
# imported: tasks and worker are sibling layers (issue 11), and the worker passes it in.
JobContext = Any


P = ParamSpec("P")
T = TypeVar("T")

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("jobstate_task", default=None)


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


def current() -> JobContext:
    """The ``JobContext`` of the task running in this worker (any task, with or
    without ``takes_context``); ``RuntimeError`` outside one."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("jobstate.tasks.current() is only available while a task runs in a worker")
    return ctx


def _spec(kind: str) -> Any:
    try:
        return registry.get_handler(kind)
    except UnknownKind:
        return None


def register(task: Task[..., Any], queue: str | None = None) -> str:
    """Register ``task``'s kind (in ``queue``, default: its own) in jobstate's
    handler registry, once per kind and options; return the kind. ``InvalidTask``
    if the kind belongs to something else."""
    kind = kind_of(task, queue)
    wanted = (
        task.func,
        option(task, "max_attempts"),
        option(task, "timeout"),
        option(task, "concurrency"),
        option(task, "retry_backoff"),
    )
    existing = _spec(kind)
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
    )(_handler(task, wanted))
    return kind


def _handler(task: Task[..., Any], wanted: tuple[Any, ...]) -> Callable[[JobContext], Any]:
    def run(ctx: JobContext) -> Any:
        return execute(task, ctx)

    run.__module__ = task.func.__module__
    run.__qualname__ = task.func.__qualname__
    run.__name__ = task.func.__name__
    run.__doc__ = task.func.__doc__ or f"Task {task.module_path}"
    run.jobstate_task = task  # type: ignore[attr-defined]
    run.jobstate_options = wanted  # type: ignore[attr-defined]
    return run


def execute(task: Task[..., Any], ctx: JobContext) -> Any:
    """Run one attempt of a task job in a worker: what the registered handler does."""
    parameters = ctx.job.parameters or {}
    args = list(parameters.get("args") or [])
    kwargs = dict(parameters.get("kwargs") or {})
    rebuilt = rebuild_task(task, ctx.job)
    result = build_result(ctx.job, rebuilt)
    sender = backend_class(rebuilt)
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


def backend_class(task: Task[..., Any]) -> type[Any]:
    """The class of the backend ``task`` was enqueued on: the sender of the signals,
    as Django sends them (a subclass of ``JobstateBackend``, say). ``JobstateBackend``
    for an alias no longer in ``TASKS``: its job still runs."""
    try:
        return type(task.get_backend())
    except ImproperlyConfigured:  # InvalidTaskBackend (InvalidTaskBackendError in the backport)
        return JobstateBackend


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
        job = Job.objects.filter(pk=change.job_id).first()
        if job is not None:
            task_finished.send(attempt.sender, task_result=build_result(job, attempt.task))

    transaction.on_commit(send, robust=True)


def stored(value: Any) -> Any:
    """``value`` as the database stores it and ``get_result`` reads it back (a dict's
    keys become strings)."""
    return json.loads(json.dumps(value)) if isinstance(value, dict | list) else value


def rebuild_task(base: Task[..., Any], job: Job) -> Task[..., Any]:
    """The Task a job was enqueued with, from the registered one and the job's row."""
    parameters = job.parameters or {}
    run_after = parameters.get("run_after")
    queue, _kind = split_kind(job.kind)
    changes = {
        "priority": job.priority,
        "queue_name": queue,
        "backend": parameters.get("backend", "default"),
        "run_after": datetime.fromisoformat(run_after) if run_after else None,
    }
    if isinstance(base, JobstateTask):
        changes["key"] = base.key if callable(base.key) and job.key else job.key
        changes["owner"] = _owner(base.owner, job)
    if all(getattr(base, name) == value for name, value in changes.items()):
        return base
    # A copy, not dataclasses.replace(): the task was validated when it was enqueued,
    # and validating it again (Task.__post_init__) would only cost time here.
    task = object.__new__(type(base))
    for field in dataclasses.fields(base):
        object.__setattr__(task, field.name, changes.get(field.name, getattr(base, field.name)))
    return task


def _owner(given: Any, job: Job) -> Any:
    """The job's owner, as the task was given it if that is the same user (no query)."""
    if job.owner_id is None:
        return None
    if isinstance(given, Model) and given.pk == job.owner_id:
        return given
    return job.owner


def task_for_kind(kind: str) -> Task[..., Any] | None:
    """The registered Task of a job kind; for a kind not registered in this process,
    the Task its module path names in a module already imported (never imported
    here: the kind is stored data), if any."""
    spec = _spec(kind)
    if spec is not None:
        return getattr(spec.func, "jobstate_task", None)
    queue, path = split_kind(kind)
    if "." not in path:
        return None
    found, _ = loaded_task(path)
    if found is None:
        return None
    # A queue this process never registered the task in (named only in another
    # process's .using(queue_name=...)): the job is still that task's.
    return found if kind_of(found, queue) == kind else None


class JobstateBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "jobstate.tasks.JobstateBackend"}}``.

    ``OPTIONS``: ``MAX_ATTEMPTS`` (attempts for tasks that do not set
    ``max_attempts``; default: ``JOBSTATE["DEFAULT_MAX_ATTEMPTS"]``),
    ``MODULES`` (modules to import at startup so workers know their tasks,
    besides every installed app's ``tasks`` module).
    """

    task_class = JobstateTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task[..., Any]) -> None:
        if not inspect.isfunction(task.func):
            # Django's own check refuses it too, but jobstate's below read the function's
            # module path first (a partial or callable object has none: AttributeError).
            raise InvalidTask("Task function must be defined at a module level.")
        validate_options(task)
        super().validate_task(task)
        register(task)
        # Workers must know the task's kind in every queue it may be sent to,
        # though only the enqueuing process ever calls .using(queue_name=...).
        for queue in sorted(self.queues - {task.queue_name}):
            register(task, queue)

    def enqueue(self, task: Task[..., Any], args: Iterable[Any], kwargs: dict[str, Any]) -> Any:
        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        parameters = self._parameters(task, args, kwargs)
        key = option(task, "key")
        if callable(key):
            key = key(*args, **kwargs)
            if not storable_key(key):
                raise InvalidTask(
                    f"The key callable of {task.module_path} returned {key!r}; it must return a "
                    f"non-empty string of at most 255 characters ({KEY_TEXT})."
                )
        owner = option(task, "owner")
        job, created = services.get_or_enqueue(
            kind_of(task),
            parameters,
            owner=owner,
            key=key,
            priority=task.priority,
            run_after=task.run_after,
            max_attempts=self._max_attempts(task),
            # None: the owner (a user or a user id, resolved by the service) is the actor.
            actor=services.Actor.system(f"tasks:{self.alias}") if owner is None else None,
        )
        if created:
            result = build_result(job, task, events=[])
            task_enqueued.send(type(self), task_result=result)
            return result
        return build_result(job, rebuild_task(task, job))

    def check_job(self, task: Task[..., Any], args: Iterable[Any], kwargs: dict[str, Any]) -> None:
        """What ``enqueue`` checks of the job it would write (its parameters' size
        included), writing nothing: ``ValidationError``, as ``enqueue`` raises it."""
        services.check_job(
            kind_of(task),
            self._parameters(task, list(args), dict(kwargs)),
            priority=task.priority,
            run_after=task.run_after,
            max_attempts=self._max_attempts(task),
        )

    def _parameters(self, task: Task[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        # What the database will store and get_result() read back (dict keys become strings).
        parameters = json.loads(json_text(normalize_json({"args": args, "kwargs": kwargs}), "parameters"))
        if task.backend != "default":
            parameters["backend"] = task.backend
        if task.run_after is not None:
            parameters["run_after"] = task.run_after.isoformat()
        return dict(parameters)

    def _max_attempts(self, task: Task[..., Any]) -> int | None:
        given = option(task, "max_attempts")
        # A whole float (5.0) is a valid option; the service takes an int only.
        return int(given) if given is not None else self.options.get("MAX_ATTEMPTS")

    def get_result(self, result_id: str) -> Any:
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.select_related("owner").filter(pk=pk).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        task = task_for_kind(job.kind)
        if task is None:
            if enqueued_as_task(job):
                raise unavailable(job)
            raise TaskResultDoesNotExist(result_id)  # a job of a plain jobstate handler
        return build_result(job, rebuild_task(task, job))

    # A generator: Django's checks take any iterable (the stub says list).
    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:  # type: ignore[override]
        yield from super().check(**kwargs)
        if not apps.is_installed("jobstate"):
            yield checks.Error(
                f"{type(self).__name__} is configured in TASKS[{self.alias!r}] but jobstate is not installed",
                hint="Add 'jobstate' (and 'django_q') to INSTALLED_APPS. "
                "See docs/reference/checks.md in the jobstate documentation.",
                id="jobstate.E901",
            )
        yield from options_problems(self.alias, self.options)


def enqueue_on_commit(task: Task[..., Any], /, *args: Any, **kwargs: Any) -> None:
    """Enqueue ``task`` with ``args`` and ``kwargs`` (all of them the task's: ``task``
    is positional-only) once the current transaction commits (at once outside one);
    nothing is enqueued if it rolls back. ``jobstate``'s own ``enqueue`` is already
    part of the transaction it runs in: use this when the job must not exist before the
    caller's work is committed elsewhere (another database), or to keep enqueueing out
    of a long transaction. The task's options and whether its arguments can be stored
    (as JSON, within the size limit) are checked now, so that those errors raise in the
    caller's transaction (which then rolls back); the rest (a key callable's value, say)
    is checked at the commit, as ``enqueue`` checks it.

    Earlier versions took ``using=`` as the database whose transaction to wait for; a
    ``using=`` the task's function cannot receive still means that (deprecated)."""
    using = None
    if "using" in kwargs and not _takes_keyword(task, "using"):
        warnings.warn(
            "enqueue_on_commit(..., using=alias) is deprecated: use "
            "transaction.on_commit(functools.partial(task.enqueue, ...), using=alias)",
            DeprecationWarning,
            stacklevel=2,
        )
        using = kwargs.pop("using")
    backend = task.get_backend()
    backend.validate_task(task)
    if isinstance(backend, JobstateBackend):
        backend.check_job(task, args, kwargs)
    else:
        json_text(normalize_json({"args": list(args), "kwargs": kwargs}), "parameters")
    transaction.on_commit(lambda: task.enqueue(*args, **kwargs), using=using)


def _takes_keyword(task: Task[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(task.func).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume it does
        return True
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in parameters
    )
