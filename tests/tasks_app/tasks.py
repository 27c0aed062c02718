"""Tasks written against Django's tasks API only (ported from the tasks that
Django's own tests and django-tasks-db's tests use)."""

from __future__ import annotations

import time
from typing import Any

try:  # Django 6.0+
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2 + the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task()
async def async_echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


class CustomError(Exception):
    pass


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_custom_error() -> None:
    raise CustomError("This task failed due to CustomError")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    # Neither JSON-serialisable nor picklable.
    return lambda: True


@task()
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> dict[str, Any]:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True)
async def async_context(context: TaskContext) -> int:
    return context.attempt


@task(queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"
