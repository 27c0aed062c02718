"""Jobs enqueued as tasks whose task this process cannot find any more."""

from __future__ import annotations

import sys
from typing import Any

from jobstate import registry
from jobstate.models import Job
from jobstate.tasks.compat import Task
from jobstate.tasks.exceptions import TaskUnavailable
from jobstate.tasks.options import kind_of, split_kind

_TASK_PARAMETERS = frozenset({"args", "kwargs", "backend", "run_after"})
_ABSENT = object()


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


def loaded_task(path: str) -> tuple[Task[..., Any] | None, str]:
    """The Task a module path ("myapp.tasks.send") names in a module this process has
    already imported, or None and why not. The path comes from a stored job kind, so
    it is looked up in ``sys.modules`` only: a module named by stored data is never
    imported (``jobstate.tasks.install`` imports the tasks modules at startup)."""
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    if module is None:
        return None, (
            f"module {module_name!r} is not loaded in this process, and jobstate never imports a module "
            "a job kind names; if it still exists, list it in the backend's OPTIONS['MODULES']"
        )
    found = getattr(module, name, _ABSENT)
    if found is _ABSENT:
        return None, f'module "{module_name}" does not define a "{name}" attribute'
    if not isinstance(found, Task):
        return None, f"{path} is not a Task (a {type(found).__name__!r} object)"
    return found, ""


def _why(kind: str) -> str:
    """What stands in the way of ``rebuild.task_for_kind``."""
    queue, path = split_kind(kind)
    if "." not in path:
        return "no task is registered under that kind"
    found, why = loaded_task(path)
    if found is None:
        return why
    return f"{path} is now the task of kind {kind_of(found, queue)!r}"
