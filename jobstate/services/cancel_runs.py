"""A cancel that needs one more run: a queued or waiting job whose higher layer
must still do something in a worker before it ends ``cancelled`` (a workflow with
``undo_on_cancel`` runs the undos of its completed steps: ``hooks.cancelling``).

Such a job keeps its cancel request and goes (or stays) ``queued``, ready now; its
active children are cancelled as a cancel would. The history row says why and
carries ``recovery``, so ``begin`` runs it despite the request (``recovery_runs.recovering``)
and its run ends the job ``cancelled``. A second request finds that run pending and
leaves it be: the first request stands. A child that its parent's end cancels
(``cascade``) gets the same run (``cascade.undo_runs``), its history row naming the parent.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from jobstate import hooks
from jobstate.models import Job
from jobstate.services import cascade
from jobstate.services._rows import record_event
from jobstate.services.actors import Actor
from jobstate.services.recovery_runs import CANCEL_RUN_MARK, recovering
from jobstate.services.transitions import lock_parent, move
from jobstate.states import Status


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
            metadata=CANCEL_RUN_MARK,
            condition=Q(status=Status.WAITING),
            now=now,
        )
    else:
        Job.objects.filter(pk=job.pk, status=Status.QUEUED).update(
            cancel_requested_at=found[0] or now, run_after=now, updated_at=now
        )
        record_event(
            job.pk, Status.QUEUED, Status.QUEUED, "request_cancel", who, text[:1000], CANCEL_RUN_MARK, now
        )
    return True
