"""What an operator may do to a job from the admin (the bulk list actions that run
them: ``jobstate.admin.bulk``).

Every operation goes through ``jobstate.services`` with ``Actor.admin(user)``
and a reason, so the history row names the admin user. Nothing here assigns a
status itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.utils import timezone

from jobstate import services
from jobstate.admin import children, display
from jobstate.exceptions import AlreadyRetried, InvalidTransition, JobStateError, UnknownKind
from jobstate.models import Job
from jobstate.models.job import latest_retry, was_retried
from jobstate.services import Actor
from jobstate.services.control import cancel_run_pending
from jobstate.states import TERMINAL, Status

# Errors a refused operation raises; their message is shown to the operator.
REFUSALS: tuple[type[Exception], ...] = (JobStateError, ValidationError, Job.DoesNotExist)
REASON_MAX_LENGTH = 1000  # as the API's and the history's


def posted_text(request: Any, name: str) -> str:
    """A free-text field as the services should store it: trimmed, without the NUL
    characters PostgreSQL refuses (Django's form fields reject them; raw POST reads do not)."""
    return (request.POST.get(name) or "").replace("\x00", "").strip()


def reason_too_long(reason: str) -> str | None:
    """The single-job form's error for a reason over REASON_MAX_LENGTH, or None."""
    try:
        MaxLengthValidator(REASON_MAX_LENGTH)(reason)
    except ValidationError as exc:
        return refusal_text(exc)
    return None


def refusal_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    if isinstance(exc, InvalidTransition):
        return exc.refusal
    return str(exc)


@dataclass(frozen=True)
class Operation:
    name: str
    label: str
    participle: str  # what the job is once done: "can be cancelled"
    permission: str  # codename in the jobstate app
    summary: str  # what happens, shown on the confirmation page
    allowed: Callable[[Job], bool]
    perform: Callable[[Job, Any, str], Job]
    done: Callable[[Job, Job], str]
    danger: bool = False
    ends_children: bool = False  # its unfinished children are cancelled (services.cascade)
    summary_many: str = ""  # the summary for several jobs (bulk), where ``summary`` is singular

    def summary_for(self, jobs: int) -> str:
        return self.summary_many if jobs > 1 and self.summary_many else self.summary

    def has_permission(self, user: Any) -> bool:
        return bool(user.has_perm(f"jobstate.{self.permission}"))

    def run(self, job: Job, user: Any, reason: str) -> Job:
        return self.perform(job, user, reason)


def _cancel(job: Job, user: Any, reason: str) -> Job:
    return services.request_cancel(job, Actor.admin(user), reason)


def _force_cancel(job: Job, user: Any, reason: str) -> Job:
    return services.force_cancel(job, Actor.admin(user), reason)


def _retry(job: Job, user: Any, reason: str) -> Job:
    try:
        return services.retry(job, Actor.admin(user), reason)
    except UnknownKind as exc:  # the job's kind, not one the operator gave
        raise ValidationError(exc.retry_refusal) from None


def _requeue(job: Job, user: Any, reason: str) -> Job:
    return services.requeue(job, Actor.admin(user), reason)


def _fail(job: Job, user: Any, reason: str) -> Job:
    return services.force_fail(job, Actor.admin(user), reason)


def _cancel_done(before: Job, after: Job) -> str:
    if after.status == Status.CANCELLED:
        return f"Job cancelled{children.ended(after)}."
    if after.status == Status.QUEUED:
        return (
            "Cancel requested: the job is queued for one run of its undos, then ends cancelled"
            f"{children.ended(after)}."
        )
    return (
        "Cancel requested: the worker stops the job at its next heartbeat or progress report"
        f"{children.ended(after)}."
    )


def held_until(after: Job) -> datetime | None:
    """When a requeued job's next attempt may start, if later than now: its old lease
    still ran (``services.requeue``)."""
    if after.status == Status.QUEUED and after.run_after > timezone.now():
        return after.run_after
    return None


def _requeue_done(before: Job, after: Job) -> str:
    held = held_until(after)
    if held is not None:
        return (
            f"Job requeued: its next attempt starts after {display.exact_time(held)}, "
            "when its old lease would have run out."
        )
    return "Job requeued."


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "cancel",
            "Cancel",
            "cancelled",
            "cancel_job",
            "A queued job is cancelled at once (but a workflow with undo_on_cancel that has run: it "
            "is queued for one run of its undos first); a processing job is asked to stop and its "
            "worker ends it cancelled.",
            lambda j: (
                j.status == Status.WAITING
                or (j.status in (Status.QUEUED, Status.PROCESSING) and j.cancel_requested_at is None)
            ),
            _cancel,
            _cancel_done,
            danger=True,
            ends_children=True,
        ),
        Operation(
            "force_cancel",
            "Force cancel",
            "force cancelled",
            "cancel_job",
            "The job is cancelled now on behalf of its worker, which has not honoured the cancel "
            "request; the worker's lease stops working. A queued job waiting for the run of its "
            "cancel's undos is cancelled without them.",
            lambda j: j.status in (Status.PROCESSING, Status.QUEUED) and j.cancel_requested_at is not None,
            _force_cancel,
            lambda b, a: (
                f"Job cancelled{children.ended(a)}"
                + (", its undos not run." if cancel_run_pending(b) else ".")
                if b.status == Status.QUEUED
                else f"Job cancelled on behalf of its worker{children.ended(a)}."
            ),
            danger=True,
            ends_children=True,
        ),
        Operation(
            "retry",
            "Retry",
            "retried",
            "retry_job",
            "A new job with the same kind and parameters is queued, linked to this one; this job "
            "and its history stay as they are.",
            lambda j: j.status in TERMINAL and not was_retried(j),  # a job is retried once
            _retry,
            lambda b, a: f"Retry queued as job {a.pk}.",
            summary_many="For each job, a new job with the same kind and parameters is queued, linked "
            "to it; the selected jobs and their history stay as they are.",
        ),
        Operation(
            "requeue",
            "Requeue",
            "requeued",
            "requeue_job",
            "The job goes back to the queue; its current worker's lease stops working. While that "
            "lease would still run, its handler may too: the next attempt waits until the lease "
            "would have run out, when the worker's watchdog has stopped it (a lease that expired "
            "already: at once). If no attempt is left, one more is granted. A waiting job is woken now.",
            lambda j: j.status in (Status.PROCESSING, Status.WAITING),  # a waiting job is woken
            _requeue,
            _requeue_done,
            summary_many="Each job goes back to the queue; its current worker's lease stops working. "
            "While that lease would still run, its handler may too: its next attempt waits until the "
            "lease would have run out, when the worker's watchdog has stopped it (a lease that expired "
            "already: at once). If no attempt is left, one more is granted. A waiting job is woken now.",
        ),
        Operation(
            "fail",
            "Fail",
            "failed",
            "requeue_job",
            "The job ends failed, with the reason as its error message. It is not retried.",
            lambda j: j.status in (Status.QUEUED, Status.WAITING, Status.PROCESSING),
            _fail,
            lambda b, a: f"Job failed{children.ended(a)}.",
            danger=True,
            ends_children=True,
        ),
    )
}


def not_offered(op: Operation, job: Job) -> str:
    """Why ``op`` is not offered for ``job`` now (its ``allowed`` is false)."""
    if op.name == "retry" and job.status in TERMINAL:
        retry = latest_retry(job.pk)
        if retry is not None:
            return f"{op.label} refused: {AlreadyRetried(job.pk, retry)}"
    return f"{op.label} is not possible now: the job is {Status(job.status).label.lower()}."


def refused_as(op: Operation, job: Job) -> str:
    """Why ``op`` would refuse ``job`` (its ``allowed`` is false), in a word or two for the
    bulk confirmation's count of them ("3 completed, 1 already retried")."""
    if op.name == "retry" and job.status in TERMINAL:
        return "already retried"
    if op.name == "cancel" and job.status == Status.PROCESSING:
        return "already asked to stop"
    return Status(job.status).label.lower()


def refused_groups(op: Operation, jobs: Iterable[Job]) -> list[tuple[str, int]]:
    """The jobs ``op`` would refuse, counted by why, most first."""
    counts: dict[str, int] = {}
    for job in jobs:
        if not op.allowed(job):
            why = refused_as(op, job)
            counts[why] = counts.get(why, 0) + 1
    return sorted(counts.items(), key=lambda item: -item[1])


def available(job: Job, user: Any) -> list[Operation]:
    """Operations the job's current state allows and the user may perform."""
    return [op for op in OPERATIONS.values() if op.allowed(job) and op.has_permission(user)]
