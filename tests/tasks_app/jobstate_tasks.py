"""Tasks that use jobstate's options and context (``backend="single"`` ones
validate against the second jobstate backend)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from jobstate.exceptions import NonRetryable, Partial, Suspend
from jobstate.tasks import JobstateTaskContext, current
from jobstate.tasks import task as typed_task
from jobstate.tasks.compat import TaskContext

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task(max_attempts=2, retry_backoff=0)
def flaky(marker: str) -> str:
    """Fails its first attempt."""
    from jobstate.models import Job

    job = current().job
    if job.attempts == 1:
        raise RuntimeError(f"first attempt of {marker} fails")
    return Job.objects.get(pk=job.pk).kind


@task(max_attempts=3, retry_backoff=0)
def always_fails() -> None:
    raise KeyError("missing")


@task(max_attempts=3)
def non_retryable() -> None:
    raise NonRetryable("give up at once")


@task()
def partial_result() -> None:
    raise Partial("2 of 3 rows", result={"rows": 2})


@task(takes_context=True, kind="reports.progress")
def with_progress(context: TaskContext, steps: int) -> int:
    for i in range(steps):
        context.jobstate.progress(100 * (i + 1) // steps, f"step {i + 1}")
    context.jobstate.add_asset("report", b"done", name="report.txt", content_type="text/plain")
    return steps


@task(takes_context=True, max_attempts=5, retry_backoff=0)
def context_attempts(context: TaskContext) -> int:
    if context.attempt < 2:
        raise RuntimeError("again")
    return context.attempt


@task(key=lambda account: f"account-{account}")
def sync_account(account: int) -> int:
    return account


@task(key="singleton")
def singleton() -> str:
    return "one"


@task(timeout=0.5, max_attempts=1)
def too_slow() -> None:
    time.sleep(5)


@task(concurrency=1)
def limited() -> None:
    return None


@task(takes_context=True)
def cancellable(context: TaskContext, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        context.jobstate.check_cancelled()
        time.sleep(0.05)
    return "not cancelled"


@task(takes_context=True)
def reports_attempt(context: TaskContext) -> int:
    return context.attempt


@task(takes_context=True)
def suspends_once(context: TaskContext, wait_for_children: bool) -> int:
    """Gives its worker back (``Suspend``) on its first run: for an hour, or until its
    children end (it has none: it is woken at once)."""
    if not context.jobstate.job.events.filter(transition__in=["suspend", "requeue"]).exists():
        later = None if wait_for_children else dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        raise Suspend("later", until=later)
    return context.attempt


@task(backend="single")
def single_fails() -> None:
    raise ValueError("no retries on this backend")


@task(backend="single", queue_name="anything")
def single_queue() -> str:
    return "ok"


def blocking(seconds: float) -> Any:
    time.sleep(seconds)
    return seconds


@task(max_attempts=2, retry_backoff=0)
def sleeper(seconds: float) -> float:
    """Sleeps (the e2e tests stop its worker to see the reaper rescue it)."""
    return blocking(seconds)


@task()
def returns_nan() -> float:
    return float("nan")


# Declared with jobstate.tasks.task, the typed decorator (tests/test_tasks_typed.py).
@typed_task(max_attempts=2, retry_backoff=0, key=lambda n: f"typed-{n}", kind="typed.keyed")
def typed_keyed(n: int) -> int:
    if current().job.attempts == 1:
        raise RuntimeError("first attempt fails")
    return n * 2


@typed_task
def typed_bare(n: int) -> int:
    return n + 1


@typed_task(takes_context=True, timeout=30, concurrency=3)
def typed_context(context: JobstateTaskContext, steps: int) -> int:
    context.jobstate.progress(50, "half way")
    return context.attempt + steps


@task(takes_context=True, max_attempts=1)
async def async_progress(context: TaskContext, direct: bool) -> str:
    """The form docs/howto/django-tasks.md gives for an async task (with ``direct``,
    also the call it warns of)."""
    from asgiref.sync import sync_to_async

    if direct:
        context.jobstate.progress(10, "direct")
    await sync_to_async(context.jobstate.progress)(50, "half way")
    await sync_to_async(context.jobstate.heartbeat)()
    await sync_to_async(current().check_cancelled)()
    return "done"
