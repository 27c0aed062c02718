"""Which ended jobs ``services.retry`` accepts, defined once: ``retryable_q`` is the
filter lists use (the stuck page offers a retry only where it would be accepted),
and ``refuse`` is the check ``retry`` makes under its row locks, from the same
expressions. The registry decides the rest: a kind without a handler is refused
(``UnknownKind``); parameters its schema no longer accepts only at the retry."""

from __future__ import annotations

from django.db.models import BooleanField, Case, Exists, OuterRef, Q, Value, When

from jobstate.exceptions import AlreadyRetried, DuplicateActiveKey, ParentEnded
from jobstate.models import Job
from jobstate.models.job import latest_retry
from jobstate.registry import all_handlers
from jobstate.states import ACTIVE, TERMINAL, Status

# A child's retry is refused once its parent failed or was cancelled (or is being
# cancelled): that ended its active children, and the cancel's cascade would not
# see a child queued meanwhile. Retry the parent instead.
PARENT_ENDED = (Status.FAILED, Status.CANCELLED)


def parent_ends() -> Q:
    ending = Q(status__in=PARENT_ENDED) | Q(status__in=ACTIVE, cancel_requested_at__isnull=False)
    return Q(Exists(Job.objects.filter(ending, pk=OuterRef("parent_id"))))


def retried() -> Q:
    """A job is retried once: retry its retry instead."""
    return Q(Exists(Job.objects.filter(retry_of=OuterRef("pk"))))


def key_in_use() -> Q:
    """An active job of its kind holds its key. Keys are scoped per owner (no owner:
    the system's scope); a job without a key never matches (``key = NULL``)."""
    holders = Job.objects.filter(kind=OuterRef("kind"), key=OuterRef("key"), status__in=ACTIVE)
    return (Q(owner__isnull=True) & Exists(holders.filter(owner__isnull=True))) | (
        Q(owner__isnull=False) & Exists(holders.filter(owner_id=OuterRef("owner_id")))
    )


# In the order ``refuse`` reports them.
REFUSALS = {"parent_ends": parent_ends, "retried": retried, "key_in_use": key_in_use}


def retryable_q() -> Q:
    """The jobs ``services.retry`` accepts now: ended, of a registered kind, and
    refused for none of ``REFUSALS``."""
    q = Q(status__in=TERMINAL, kind__in=sorted(all_handlers()))
    for refusal in REFUSALS.values():
        q &= ~refusal()
    return q


def refuse(job: Job) -> None:
    """Raise what refuses a retry of ``job`` (ended, its parent's row and its own
    locked): ``ParentEnded``, ``AlreadyRetried`` or ``DuplicateActiveKey``."""
    flags = {
        name: Case(When(refusal(), then=Value(True)), default=Value(False), output_field=BooleanField())
        for name, refusal in REFUSALS.items()
    }
    found = Job.objects.filter(pk=job.pk).annotate(**flags).values(*REFUSALS).first()
    if found is None:
        raise Job.DoesNotExist(f"Job {job.pk} no longer exists (deleted meanwhile)")
    if found["parent_ends"]:
        status = Job.objects.filter(pk=job.pk).values_list("parent__status", flat=True).get()
        raise ParentEnded(job.parent_id, status if status in PARENT_ENDED else "being cancelled")
    if found["retried"]:
        raise AlreadyRetried(job.pk, latest_retry(job.pk))
    if found["key_in_use"]:
        raise DuplicateActiveKey(f"An active '{job.kind}' job already has key '{job.key}'")
