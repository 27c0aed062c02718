"""Jobs enqueued as tasks whose task this process cannot find any more."""

from __future__ import annotations

from django.utils.module_loading import import_string

from jobstate import registry
from jobstate.models import Job
from jobstate.tasks.compat import Task
from jobstate.tasks.exceptions import TaskUnavailable
from jobstate.tasks.options import kind_of, split_kind

_TASK_PARAMETERS = frozenset({"args", "kwargs", "backend", "run_after"})


def enqueued_as_task(job: Job) -> bool:
    """Whether the job's parameters have the shape ``enqueue`` stores for a task call
    (a kind registered as a plain handler is not a task's, whatever its parameters)."""
    parameters = job.parameters
    return (
        job.kind not in registry.all_handlers()
        and isinstance(parameters, dict)
        and isinstance(parameters.get("args"), list)
        and isinstance(parameters.get("kwargs"), dict)
        and set(parameters) <= _TASK_PARAMETERS
    )


def unavailable(job: Job) -> TaskUnavailable:
    """The error ``get_result`` raises for such a job: which job, which task, why."""
    return TaskUnavailable(
        f"Job {job.pk} exists, but its task {job.kind!r} is not found in this process "
        f"({_why(job.kind)}): renamed or removed from the code? No worker runs it either; "
        "cancel the job, or restore the task under that name.",
        result_id=str(job.pk),
        kind=job.kind,
    )


def _why(kind: str) -> str:
    """What stands in the way of ``backend.task_for_kind``."""
    queue, path = split_kind(kind)
    if "." not in path:
        return "no task is registered under that kind"
    try:
        found = import_string(path)
    except Exception as exc:  # what the import says: any error its module raises
        return f"{type(exc).__name__}: {exc}"
    if not isinstance(found, Task):
        return f"{path} is not a Task (a {type(found).__name__!r} object)"
    return f"{path} is now the task of kind {kind_of(found, queue)!r}"
