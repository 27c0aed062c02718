"""Checked by ``make typecheck`` (mypy, strict), never run: what a project's own
type checker sees of ``jobstate.tasks.task``. A regression here is a type error
in CI, as it would be in a user's project."""

from __future__ import annotations

from jobstate.tasks import JobstateTask, JobstateTaskContext, task
from jobstate.tasks.compat import TaskResult


@task(max_attempts=5, retry_backoff=lambda attempt: 2.0**attempt, key=lambda to: to, timeout=30)
def send(to: str, retries: int = 0) -> int:
    return len(to) + retries


@task
def bare(n: int) -> str:
    return str(n)


@task(takes_context=True, concurrency=2, kind="typing.report")
def report(context: JobstateTaskContext, n: int) -> float:
    context.jobstate.progress(50, "half way")
    return n / 2


checked_send: JobstateTask[[str, int], int] = send
checked_bare: JobstateTask[[int], str] = bare
checked_report: JobstateTask[[int], float] = report
# jobstate's per-call options keep the task's type, and its arguments stay checked.
keyed: JobstateTask[[str, int], int] = send.using(owner=1, key="welcome", priority=10)
sent: TaskResult[[str, int], int] = send.enqueue("a@example.com", retries=1)
half: TaskResult[[int], float] = report.enqueue(3)
value: float | None = half.return_value
send.enqueue(3)  # type: ignore[arg-type]
bare.using(owner=1).enqueue("x")  # type: ignore[arg-type]
wrong: JobstateTask[[int], int] = send  # type: ignore[assignment]
