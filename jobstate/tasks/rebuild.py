"""The ``Task`` of a stored job: the registered one, rebuilt with the options the job
was enqueued with (its queue, priority, backend, run_after, key and owner)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.db.models import Model

from jobstate import registry
from jobstate.exceptions import UnknownKind
from jobstate.models import Job
from jobstate.tasks.compat import Task
from jobstate.tasks.missing import loaded_task
from jobstate.tasks.options import kind_of, split_kind
from jobstate.tasks.task_types import JobstateTask


def spec_of(kind: str) -> Any:
    """The registered handler of a job kind (None if there is none)."""
    try:
        return registry.get_handler(kind)
    except UnknownKind:
        return None


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
    spec = spec_of(kind)
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
