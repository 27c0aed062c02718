"""Retrying a finished job: a new job linked to it (``retry_of``), the old one untouched.

Split from ``control`` (the other operator actions) to keep each module small.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from jobstate.exceptions import DuplicateActiveKey, InvalidTransition
from jobstate.models import Job
from jobstate.registry import get_handler
from jobstate.services import retryable
from jobstate.services._rows import JobRef, create_job
from jobstate.services._rows import get_job as _get
from jobstate.services.actors import Actor
from jobstate.services.enqueue import get_or_enqueue
from jobstate.services.transitions import lock_parent
from jobstate.states import TERMINAL, Status

__all__ = ["retry"]


def retry(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """A new job linked to a terminal one (``retry_of``); the old one is untouched.

    A job is retried once: one that has a retry already raises ``AlreadyRetried``
    (retry the newest instead). A child whose parent failed, was cancelled or is
    being cancelled raises ``ParentEnded``; a job whose key an active job holds,
    ``DuplicateActiveKey`` (``jobstate.services.retryable``, which lists use too).
    A job deleted meanwhile (retention) raises ``Job.DoesNotExist``."""
    old = _get(job)
    if old.status not in TERMINAL:
        raise InvalidTransition(old.status, Status.QUEUED, "retry")
    try:
        with transaction.atomic():
            lock_parent(old)
            _lock_retried(old.pk)
            retryable.refuse(old)
            new, _created = (
                get_or_enqueue(
                    old.kind,
                    old.parameters,
                    owner=old.owner,
                    priority=old.priority,
                    max_attempts=old.max_attempts,
                    retry_of=old,
                    parent=old.parent,
                    actor=actor,
                    reason=reason or f"retry of {old.pk}",
                )
                if old.key is None
                else _retry_keyed(old, actor, reason)
            )
    except IntegrityError:
        raise DuplicateActiveKey(f"An active '{old.kind}' job already has key '{old.key}'") from None
    return new


def _lock_retried(job_id: Any) -> None:
    """Lock the retried job's row (after its parent's: parents before children):
    retention, which skips locked rows, cannot delete it under the new job's
    ``retry_of`` (that foreign key's error at commit read as a duplicate key), and
    two retries of it take turns, the second seeing the first's new job."""
    if not list(Job.objects.filter(pk=job_id).select_for_update(no_key=True).values_list("pk", flat=True)):
        raise Job.DoesNotExist(f"Job {job_id} no longer exists (deleted meanwhile)")


def _retry_keyed(old: Job, actor: Any, reason: str) -> tuple[Job, bool]:
    # Keys are scoped per owner (owner_id=None: the system jobs' scope).
    job = create_job(
        get_handler(old.kind),
        old.parameters,
        old.owner_id,
        old.key,
        old.input_watermark,
        old.priority,
        None,
        old.max_attempts,
        old.parent,
        old,
        Actor.of(actor),
        reason or f"retry of {old.pk}",
    )
    return job, True
