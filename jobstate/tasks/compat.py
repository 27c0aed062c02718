"""One import point for Django's tasks framework: ``django.tasks`` (Django 6.0+)
or the ``django-tasks`` backport (``pip install "django-jobstate[tasks]"``) on 5.2.

Everything in ``jobstate.tasks`` imports the framework from here only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:  # Django 6.0+
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    BACKPORT = False
except ImportError:  # Django 5.2 with the django-tasks backport
    if not TYPE_CHECKING:  # type checkers read django.tasks above (django-stubs); the backport follows it
        try:
            from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task, task_backends
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "jobstate.tasks needs Django 6.0+ (django.tasks) or the django-tasks backport: "
                'pip install "django-jobstate[tasks]"'
            ) from exc
        from django_tasks import signals as _signals  # noqa: F401  (resets backends on setting_changed)
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        BACKPORT = True


__all__ = [
    "BACKPORT",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
