"""A cancel that needs one more run: a queued or waiting job whose higher layer
must still do something in a worker before it ends ``cancelled`` (a workflow with
``undo_on_cancel`` runs the undos of its completed steps: ``hooks.cancelling``).

Such a job keeps its cancel request and goes (or stays) ``queued``, ready now; its
active children are cancelled as a cancel would. The history row says why and
carries ``recovery``, so ``begin`` runs it despite the request (``lease.recovering``)
and its run ends the job ``cancelled``. A second request finds that run pending and
leaves it be: the first request stands. A child that its parent's end cancels
(``cascade``) gets the same run (``for_children``), its history row naming the parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Q

from jobstate import hooks
from jobstate.models import Job
from jobstate.services import cascade
from jobstate.services._rows import record_event
from jobstate.services.actors import Actor
from jobstate.services.lease import recovering
from jobstate.services.transitions import lock_parent, move
from jobstate.states import Status

# The history metadata of the move that gave the job its run.
RECOVERY = {"recovery": "cancel"}


class StatusMoved(Exception):
    """The job left the status the caller read before its row was locked."""


def run_first(job: Job, who: Actor, reason: str, now: datetime) -> bool:
    """Inside the caller's transaction, for ``job`` read queued or waiting: give it
    its run (True), or False when no hook asks for one (the caller cancels it)."""
    lock_parent(job)  # parents before children, as a cancel's move
    found = list(
        Job.objects.select_for_update(no_key=True)
        .filter(pk=job.pk, status=job.status)
        .values_list("cancel_requested_at", flat=True)
    )
    if not found:
        raise StatusMoved
    why = hooks.cancelling.ask(hooks.Cancelling(job.pk, job.kind, str(job.status)))
    if why is None:
        return False
    if found[0] is not None and recovering(job.pk):
        return True  # its run is pending already
    cascade.end_children(job.pk, why=Status.CANCELLED, actor=who, now=now)
    text = f"{reason}; {why}" if reason else f"cancel requested; {why}"
    if job.status == Status.WAITING:
        move(
            job.pk,
            "wake",
            actor=who,
            reason=text[:1000],
            fields={"run_after": now, "cancel_requested_at": found[0] or now},
            metadata=RECOVERY,
            condition=Q(status=Status.WAITING),
            now=now,
        )
    else:
        Job.objects.filter(pk=job.pk, status=Status.QUEUED).update(
            cancel_requested_at=found[0] or now, run_after=now, updated_at=now
        )
        record_event(job.pk, Status.QUEUED, Status.QUEUED, "request_cancel", who, text[:1000], RECOVERY, now)
    return True


# A child as ``cascade.end_children`` read it, its row locked:
# (pk, status, kind, started_at, cancel_requested_at).
Child = tuple[Any, str, str, datetime | None, datetime | None]


def for_children(
    children: Sequence[Child], reason: str, metadata: dict[str, Any], who: Actor, now: datetime
) -> tuple[set[Any], int]:
    """Inside ``cascade.end_children``'s transaction, the children's rows locked and
    their own children ended: give each queued or waiting child (or one reserved and
    not begun, as ``request_cancel`` does) the run its cancel needs, as ``run_first``
    would. Returns the ids of the children that have it now (the cascade leaves them
    be; one whose run was pending already included) and how many were given it here."""
    given: set[Any] = set()
    written = 0
    for pk, status, kind, started, requested in children:
        reserved = status == Status.PROCESSING and started is None and requested is None
        if status not in (Status.QUEUED, Status.WAITING) and not reserved:
            continue
        why = hooks.cancelling.ask(hooks.Cancelling(pk, kind, str(Status.QUEUED if reserved else status)))
        if why is None:
            continue
        given.add(pk)
        if requested is not None and recovering(pk):
            continue  # its run is pending already
        written += 1
        text = f"{reason}; {why}"[:1000]
        marked = {**metadata, **RECOVERY}
        if status == Status.WAITING:
            Job.objects.filter(pk=pk, status=status).update(
                status=Status.QUEUED,
                run_after=now,
                cancel_requested_at=requested or now,
                lease_token=None,
                lease_expires_at=None,
                updated_at=now,
            )
            record_event(pk, status, Status.QUEUED, "wake", who, text, marked, now)
        else:
            # Queued: ready now. Reserved: ``begin`` (or the reaper) gives it its run.
            fields: dict[str, Any] = {"cancel_requested_at": requested or now, "updated_at": now}
            if not reserved:
                fields["run_after"] = now
            Job.objects.filter(pk=pk, status=status).update(**fields)
            record_event(pk, status, status, "request_cancel", who, text, marked, now)
    return given, written
