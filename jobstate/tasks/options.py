"""The jobstate options a ``@task`` may carry, and the job kind it runs as."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from django.conf import settings
from django.db import connections, router

from jobstate import services
from jobstate.conf import MAX_ATTEMPTS_LIMIT
from jobstate.models import Job
from jobstate.tasks.compat import (
    DEFAULT_TASK_QUEUE_NAME,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    InvalidTask,
    Task,
)

KIND_MAX_LENGTH = Job._meta.get_field("kind").max_length or 200
# Between a queue name and the task's own kind in a job kind ("emails:myapp.tasks.send").
# A task's own kind never contains it (module paths cannot; ``kind=`` is refused), so
# everything before the last one is the queue name, which may contain it.
QUEUE_SEPARATOR = ":"


def option(task: Task[..., Any], name: str) -> Any:
    """A jobstate option of ``task`` (None for a plain ``Task`` of another backend's class)."""
    return getattr(task, name, None)


def kind_of(task: Task[..., Any], queue: str | None = None) -> str:
    """The job kind of ``task`` (in ``queue``, default: the task's own queue)."""
    base = option(task, "kind") or task.module_path
    queue = task.queue_name if queue is None else queue
    if queue != DEFAULT_TASK_QUEUE_NAME:
        return f"{queue}{QUEUE_SEPARATOR}{base}"
    return base


def split_kind(kind: str) -> tuple[str, str]:
    """A job kind read back as (queue name, the task's own kind)."""
    queue, separator, base = kind.rpartition(QUEUE_SEPARATOR)
    return (queue, base) if separator else (DEFAULT_TASK_QUEUE_NAME, kind)


KEY_TEXT = "not only whitespace, no NUL character or lone surrogate"


def storable_key(key: Any) -> bool:
    """A key the service stores (else a ValidationError at every enqueue)."""
    return services.key_problem(key) is None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    """A whole number (1 or 1.0; not inf or NaN, which int() refuses)."""
    return _number(value) and math.isfinite(value) and int(value) == value


def validate_options(task: Task[..., Any]) -> None:
    """Raise ``InvalidTask`` naming the first jobstate option that is wrong."""
    # Before Django's own range check, which compares a string with numbers (a
    # TypeError) and lets 1.0 and True through to fail as a database error at enqueue.
    if not isinstance(task.priority, int) or isinstance(task.priority, bool):
        raise InvalidTask(
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY} "
            f"(got {task.priority!r})."
        )
    if not isinstance(task.queue_name, str):
        # Django's QUEUES check refuses it only when QUEUES lists names; with QUEUES empty
        # (any name) None made the job kind "None:...", read back as the queue "None".
        raise InvalidTask(
            f"queue_name must be a string, the name of a queue (got {task.queue_name!r}); leave it out "
            f"for the default queue, {DEFAULT_TASK_QUEUE_NAME!r}."
        )
    max_attempts = option(task, "max_attempts")
    if max_attempts is not None and (not _whole(max_attempts) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT):
        raise InvalidTask(
            f"max_attempts must be a whole number between 1 and {MAX_ATTEMPTS_LIMIT} (got {max_attempts!r})."
        )
    timeout = option(task, "timeout")
    if timeout is not None and (not _number(timeout) or not timeout > 0):
        raise InvalidTask(f"timeout must be a positive number of seconds (got {timeout!r}).")
    concurrency = option(task, "concurrency")
    if concurrency is not None and (not _whole(concurrency) or concurrency < 1):
        raise InvalidTask(f"concurrency must be a whole number of at least 1 (got {concurrency!r}).")
    backoff = option(task, "retry_backoff")
    if backoff is not None and not callable(backoff) and (not _number(backoff) or not backoff >= 0):
        raise InvalidTask(
            f"retry_backoff must be a number of seconds >= 0 or a callable attempt -> seconds "
            f"(got {backoff!r})."
        )
    key = option(task, "key")
    if key is not None and not callable(key) and not storable_key(key):
        raise InvalidTask(
            f"key must be a non-empty string of at most 255 characters ({KEY_TEXT}), or a callable "
            f"that receives the task's arguments (got {key!r})."
        )
    kind = option(task, "kind")
    if kind is not None and (not isinstance(kind, str) or not kind.strip()):
        raise InvalidTask(f"kind must be a non-empty string (got {kind!r}).")
    if kind is not None and QUEUE_SEPARATOR in kind:
        raise InvalidTask(
            f"kind must not contain {QUEUE_SEPARATOR!r} (got {kind!r}): a job kind's "
            f"{QUEUE_SEPARATOR!r} separates the task's queue name from its kind "
            f"(\"emails:myapp.tasks.send\"); use another character, such as '.'."
        )
    full = kind_of(task)
    if "\x00" in full:
        raise InvalidTask(f"The job kind {full!r} holds a NUL character; the database cannot store it.")
    _check_run_after(task)
    if len(full) > KIND_MAX_LENGTH:
        raise InvalidTask(
            f"The job kind {full!r} is longer than {KIND_MAX_LENGTH} characters; give the task a "
            f"shorter kind=."
        )


def _check_run_after(task: Task[..., Any]) -> None:
    # The database stores it in UTC: an aware time late on 9999-12-31 in a zone west
    # of UTC is past the last datetime (a ValidationError at enqueue, not InvalidTask).
    run_after = task.run_after
    if run_after is not None and not isinstance(run_after, dt.datetime):
        # Before Django's own check, which raises AttributeError for a timedelta, say.
        raise InvalidTask(f"run_after must be a datetime (got {run_after!r}).")
    if run_after is None:
        return
    database = connections[router.db_for_write(Job)]
    if not settings.USE_TZ and not database.features.supports_timezones:
        # Django would raise ValueError at the INSERT: it stores no aware datetime there.
        raise InvalidTask(
            f"run_after cannot be stored with USE_TZ = False: jobstate needs a timezone-aware run_after, "
            f"which Django stores in {database.display_name} only with USE_TZ = True. Set USE_TZ = True "
            "(Django's default) to defer tasks, or enqueue without run_after."
        )
    if run_after.utcoffset() is None:
        # Before Django's own check ("run_after must be an aware datetime."), which says
        # nothing with USE_TZ = False: the service refused it then, naming no remedy.
        raise InvalidTask(
            f"run_after must be a timezone-aware datetime (got the naive {run_after.isoformat()}): "
            "jobstate stores times in UTC. Use django.utils.timezone.now() + timedelta(...) (with "
            "USE_TZ = False, where that is naive: datetime.now(datetime.UTC) + timedelta(...)), or "
            "django.utils.timezone.make_aware(value) for a time in the current time zone."
        )
    try:
        run_after.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidTask(
            f"run_after {run_after.isoformat()} is past the last time the database can store."
        ) from None
