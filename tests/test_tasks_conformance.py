"""The same assertions against Django's ``ImmediateBackend`` and jobstate's backend.

Where a standard ``@task`` program must behave the same on both (results, errors,
context, signals, JSON, validation), each test runs once per backend: on
Django's it runs at ``enqueue``, on jobstate's under the inline worker (``drain``),
after which the result is refreshed. ``get_result`` is compared with Django's
``DummyBackend`` (``ImmediateBackend`` keeps no results). The deliberate
differences (retries, a return value that is not JSON, dict keys, naive
``run_after``) are in docs/howto/django-tasks.md and tested elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobstate.models import Job
from jobstate.tasks.compat import (
    InvalidTask,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.tasks_support import run_all

pytestmark = pytest.mark.django_db(transaction=True)

FRAMEWORK = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
QUEUES = ["default", "emails"]
# One attempt, as Django's backends run a task: jobstate's retries are its own.
CONFORMANCE_TASKS = {
    "immediate": {"BACKEND": f"{FRAMEWORK}.backends.immediate.ImmediateBackend", "QUEUES": QUEUES},
    "jobstate": {
        "BACKEND": "jobstate.tasks.JobstateBackend",
        "QUEUES": QUEUES,
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    "stored": {"BACKEND": f"{FRAMEWORK}.backends.dummy.DummyBackend", "QUEUES": QUEUES},
}


class Failure(Exception):
    pass


@task()
def add(a: int, b: int = 0) -> int:
    return a + b


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task()
def returns_tuple() -> tuple[int, str]:
    return (1, "a")


@task()
def returns_bytes() -> bytes:
    return b"abc"


@task()
def fails() -> None:
    raise Failure("it broke")


@task()
def fails_with_value_error() -> None:
    raise ValueError("bad value")


class FailureGroup(ExceptionGroup):
    pass


@task()
def fails_with_a_group() -> None:
    raise FailureGroup("several", [ValueError("inner"), Failure("other")])


@task()
async def async_add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def context_seen(context: TaskContext, marker: str) -> dict[str, Any]:
    result = context.task_result
    return {
        "marker": marker,
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "started": result.started_at is not None,
        "last_attempted": result.last_attempted_at == result.started_at,
        "finished": result.finished_at is None,
        "workers": len(result.worker_ids),
        "errors": len(result.errors),
        "args": result.args,
        "kwargs": result.kwargs,
    }


@task(takes_context=True)
async def async_context_seen(context: TaskContext) -> list[Any]:
    return [context.attempt, str(context.task_result.status)]


@pytest.fixture(params=["immediate", "jobstate"])
def alias(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS = {**settings.TASKS, **CONFORMANCE_TASKS}
    return str(request.param)


@pytest.fixture
def stored(settings: Any) -> None:
    settings.TASKS = {**settings.TASKS, **CONFORMANCE_TASKS}


def run(alias: str, the_task: Any, *args: Any, **kwargs: Any) -> Any:
    """Enqueue on ``alias`` and return the result once the task has run."""
    result = the_task.using(backend=alias).enqueue(*args, **kwargs)
    if alias != "immediate":
        assert result.status == TaskResultStatus.READY
        run_all()
        result.refresh()
    return result


# -- results -------------------------------------------------------------------------


def test_a_successful_result(alias):
    result = run(alias, add, 2, b=3)
    assert isinstance(result.id, str) and result.id
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.backend == alias
    assert result.task.func is add.func and result.task.backend == alias
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_a_failed_result(alias):
    result = run(alias, fails)
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.attempts == 1 and len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class_path == f"{__name__}.Failure"
    assert error.exception_class is Failure
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.rstrip().endswith(f"{__name__}.Failure: it broke")
    assert result.started_at <= result.finished_at


def test_a_builtin_exception(alias):
    error = run(alias, fails_with_value_error).errors[0]
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.rstrip().endswith("ValueError: bad value")


def test_an_exception_group(alias):
    # jobstate read the group's header line as no header: "FailureGroup", no module.
    error = run(alias, fails_with_a_group).errors[0]
    assert error.exception_class_path == f"{__name__}.FailureGroup"
    assert error.exception_class is FailureGroup


def test_arguments_and_return_values_are_normalised_to_json(alias):
    result = run(alias, echo, (1, 2), b"x", key=("a", None))
    assert result.args == [[1, 2], "x"] and result.kwargs == {"key": ["a", None]}
    # The task receives them normalised too.
    assert result.return_value == {"args": [[1, 2], "x"], "kwargs": {"key": ["a", None]}}
    assert run(alias, returns_tuple).return_value == [1, "a"]
    assert run(alias, returns_bytes).return_value == "abc"


@pytest.mark.parametrize("value", [{1, 2}, timezone.now(), object()])
def test_arguments_that_are_not_json_raise_type_error(alias, value):
    with pytest.raises(TypeError):
        echo.using(backend=alias).enqueue(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "a\x00b", "\ud800"])
def test_arguments_the_job_table_cannot_store_are_refused_by_jobstate_only(settings, value):
    # A documented difference (docs/howto/django-tasks.md, "Parameters").
    settings.TASKS = {**settings.TASKS, **CONFORMANCE_TASKS}
    assert echo.using(backend="immediate").enqueue(value).status == TaskResultStatus.SUCCESSFUL
    with pytest.raises(ValidationError) as info:
        echo.using(backend="jobstate").enqueue(value)
    assert "parameters" in info.value.message_dict
    assert not Job.objects.exists()


def test_async_task(alias):
    assert run(alias, async_add, 1, 2).return_value == 3


def test_aenqueue(alias):
    result = async_to_sync(add.using(backend=alias).aenqueue)(4, 5)
    if alias != "immediate":
        run_all()
        async_to_sync(result.arefresh)()
    assert result.return_value == 9


# -- context -------------------------------------------------------------------------


def test_context_is_the_running_result(alias):
    result = run(
        alias,
        context_seen,
        "m",
    )
    assert result.return_value == {
        "marker": "m",
        "attempt": 1,
        "id": result.id,
        "status": "RUNNING",
        "started": True,
        "last_attempted": True,
        "finished": True,
        "workers": 1,
        "errors": 0,
        "args": ["m"],
        "kwargs": {},
    }


def test_async_context(alias):
    assert run(alias, async_context_seen).return_value == [1, "RUNNING"]


# -- signals -------------------------------------------------------------------------


@pytest.fixture
def signalled() -> Iterator[list[tuple[str, type[Any], dict[str, Any]]]]:
    """Each signal as it was sent: its name, sender and the result's fields then
    (Django's ImmediateBackend sends one result object, and changes it later)."""
    received: list[tuple[str, type[Any], dict[str, Any]]] = []
    receivers = []
    for name, signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):

        def receiver(sender: type[Any], task_result: Any, name: str = name, **kwargs: Any) -> None:
            fields = {field: getattr(task_result, field) for field in SNAPSHOT}
            fields["return_value"] = task_result._return_value
            received.append((name, sender, fields))

        signal.connect(receiver, weak=False, dispatch_uid=f"conformance_{name}")
        receivers.append(signal)
    yield received
    for name, signal in zip(("enqueued", "started", "finished"), receivers, strict=True):
        signal.disconnect(dispatch_uid=f"conformance_{name}")


SNAPSHOT = (
    "id",
    "status",
    "args",
    "kwargs",
    "backend",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "errors",
    "worker_ids",
)


def test_signals(alias, signalled):
    result = run(alias, add, 1)
    backend_class = type(task_backends[alias])
    assert [(name, sender, fields["id"]) for name, sender, fields in signalled] == [
        ("enqueued", backend_class, result.id),
        ("started", backend_class, result.id),
        ("finished", backend_class, result.id),
    ]
    on_enqueue, on_start, on_finish = (fields for _name, _sender, fields in signalled)
    assert on_enqueue["enqueued_at"] is not None and on_enqueue["args"] == [1] and on_enqueue["kwargs"] == {}
    assert on_enqueue["backend"] == alias
    assert on_start["status"] == TaskResultStatus.RUNNING
    assert on_start["started_at"] is not None and on_start["finished_at"] is None
    assert on_start["last_attempted_at"] == on_start["started_at"]
    assert len(on_start["worker_ids"]) == 1 and on_start["errors"] == []
    assert on_finish["status"] == TaskResultStatus.SUCCESSFUL and on_finish["return_value"] == 1
    assert on_finish["finished_at"] is not None and len(on_finish["worker_ids"]) == 1


def test_task_finished_of_a_failure(alias, signalled):
    result = run(alias, fails)
    finished = [fields for name, _sender, fields in signalled if name == "finished"]
    assert [fields["id"] for fields in finished] == [result.id]
    assert finished[0]["status"] == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in finished[0]["errors"]] == [f"{__name__}.Failure"]
    assert finished[0]["finished_at"] is not None


# -- validation ----------------------------------------------------------------------


def module_level(context: Any) -> None:
    pass


def no_context() -> None:
    pass


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"priority": -101}, "priority must be a whole number between -100 and 100"),
        ({"queue_name": "nope"}, "Queue 'nope' is not valid for backend."),
    ],
)
def test_using_refuses_what_django_refuses(alias, change, message):
    with pytest.raises(InvalidTask, match=message):
        add.using(backend=alias, **change)


def test_using_accepts_the_priority_range_and_configured_queues(alias):
    for priority in (-100, 0, 100):
        assert add.using(backend=alias, priority=priority).priority == priority
    assert run(alias, add.using(queue_name="emails"), 7).return_value == 7


def test_validate_task(alias):
    def local() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(backend=alias)(local)
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(backend=alias, takes_context=True)(no_context)
    with pytest.raises(TypeError):  # Django 6: "run_after cannot be defined statically"
        task(backend=alias, run_after=timezone.now())(no_context)


class CallableObject:
    def __call__(self) -> None:
        pass


@pytest.mark.parametrize("func", [functools.partial(add.func, 1), CallableObject(), str.upper, len])
def test_a_callable_that_is_no_function_is_an_invalid_task(alias, func):
    # jobstate raised AttributeError (no __qualname__) for all but len.
    with pytest.raises(InvalidTask, match="must be defined at a module level"):
        task(backend=alias)(func)


# -- get_result (compared with DummyBackend, which keeps its results) ----------------


@pytest.mark.parametrize("backend_alias", ["stored", "jobstate"])
def test_get_result(stored, backend_alias):
    backend = task_backends[backend_alias]
    result = echo.using(backend=backend_alias).enqueue(1, a=[2])
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None
    assert result.started_at is None and result.finished_at is None and result.last_attempted_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert backend.get_result(result.id) == result
    assert async_to_sync(backend.aget_result)(result.id) == result
    assert echo.using(backend=backend_alias).get_result(result.id) == result
    for missing in ["nope", "00000000-0000-0000-0000-000000000000"]:
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(backend.aget_result)(missing)


@pytest.mark.parametrize("backend_alias", ["stored", "jobstate"])
def test_run_after_must_be_aware(stored, backend_alias):
    naive = (timezone.now() + timedelta(hours=1)).replace(tzinfo=None)
    with pytest.raises(InvalidTask, match="aware"):
        add.using(backend=backend_alias, run_after=naive)
    aware = timezone.now() + timedelta(hours=1)
    result = add.using(backend=backend_alias, run_after=aware).enqueue(1)
    assert result.task.run_after == aware
    assert task_backends[backend_alias].get_result(result.id).task.run_after == aware
