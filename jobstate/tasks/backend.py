"""``JobstateBackend``: Django's tasks framework on jobstate's jobs.

Each ``@task`` function is a jobstate kind (its module path, or the ``kind`` it
gives; tasks of a queue other than "default" get the queue as a prefix:
``"emails:myapp.tasks.send"``). The kind is registered in jobstate's handler
registry the first time the backend validates the task (at decoration), so the
same workers, leases, retries, admin and API serve it. A job stores the call as
``{"args": [...], "kwargs": {...}}``.

The task class: ``jobstate.tasks.task_types``; registering and running a task's
kind: ``jobstate.tasks.handlers``; the task of a stored job: ``jobstate.tasks.rebuild``.
"""

from __future__ import annotations

import inspect
import json
import uuid
import warnings
from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.db import transaction

from jobstate import services
from jobstate.models import Job
from jobstate.storable import json_text
from jobstate.tasks.checks import options_problems
from jobstate.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from jobstate.tasks.handlers import register
from jobstate.tasks.missing import enqueued_as_task, unavailable
from jobstate.tasks.options import KEY_TEXT, kind_of, option, storable_key, validate_options
from jobstate.tasks.rebuild import rebuild_task, task_for_kind
from jobstate.tasks.results import build_result, needs_history, with_history
from jobstate.tasks.task_types import JobstateTask


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
        register(task, backend=type(self))
        # Workers must know the task's kind in every queue it may be sent to,
        # though only the enqueuing process ever calls .using(queue_name=...).
        for queue in sorted(self.queues - {task.queue_name}):
            register(task, queue, backend=type(self))

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
            # rebuild_task: the owner as get_result returns it, a user where the task was given
            # its id (the job's, already loaded: no query).
            result = build_result(job, rebuild_task(task, job), events=[])
            task_enqueued.send(type(self), task_result=result)
            return result
        if needs_history(job):  # the job again, with its history: one state of both
            job = with_history(Job.objects.select_related("owner").filter(pk=job.pk)).first() or job
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
        job = with_history(Job.objects.select_related("owner").filter(pk=pk)).first()
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
