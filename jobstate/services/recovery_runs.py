"""What a job's current run is for, read from its history: an ordinary run, or one
that a cancel request does not stop because it finishes a workflow's undos.

A run is marked by the row that started it: the reaper's requeue of a workflow
whose worker died while it compensated (``hooks.reaping``), the ``request_cancel``
or ``wake`` row that gave a queued or waiting job a run for its undos
(``hooks.cancelling``), or the ``step_failed`` row of a step that failed its
workflow for good, whose undos run in the same run, or the ``compensate_cancel``
row of a run that met its cancel as it ran and runs its undos now
(``undo_on_cancel``: ``mark_cancel_undos``). Each carries ``recovery`` in its
metadata.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import CharField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.db.models.lookups import Exact

from jobstate.models import JobEvent
from jobstate.services._rows import record_event
from jobstate.services.actors import Actor
from jobstate.states import Status

# The history metadata of the move that gave a job a run for its undos on a cancel.
CANCEL_RUN_MARK = {"recovery": "cancel"}

# The moves of ``request_cancel`` that give a queued or waiting job a run for its undos.
CANCEL_RUNS = ("request_cancel", "wake")
# A step's failure that marks the rest of its run as one that compensates (a
# workflow that failed for good: its undos run in the same run), with ``recovery``.
COMPENSATING_RUN = "step_failed"
# The row of a run that met its cancel as it ran and now runs its undos (``undo_on_cancel``).
CANCEL_UNDOS = "compensate_cancel"
CANCEL_UNDOS_REASON = "cancel requested as it ran: its undos run first"


def recovering(pk: Any) -> bool:
    """Whether the job's last requeue was the reaper's recovery run (``hooks.reaping``:
    a workflow whose worker died while it compensated, its undos left to finish, or
    before it stored its outcome; not one that waits for its children), or a cancel
    request that gave a queued or waiting job a run for its undos (``hooks.cancelling``:
    a ``request_cancel`` or ``wake`` row with ``recovery``), or the run is one whose
    workflow failed for good and now runs its undos (a ``step_failed`` row with
    ``recovery``, written as that run's step failed), or one that met its cancel as it
    ran and now runs its undos (``mark_cancel_undos``).
    A cancel request does not stop that run: the undos finish first, then the
    attempt ends ``cancelled``. Asked only of a job with a cancel request."""
    action = recovery_action(pk)
    # A "wait" run ends nothing and is woken later, not requeued: that requeue would
    # stay the last one, and exempt every later run of the job from a cancel.
    return action is not None and action != "wait"


def _runs(job_id: Any) -> QuerySet[JobEvent]:
    """The history rows that say what the job's current run is, newest first."""
    return (
        JobEvent.objects.filter(
            Q(transition="requeue")
            | Q(
                transition__in=(*CANCEL_RUNS, COMPENSATING_RUN, CANCEL_UNDOS),
                metadata__has_key="recovery",
            ),
            job_id=job_id,
        )
        .exclude(metadata__has_key="handed_back")  # a hand-back keeps what the run was
        .exclude(metadata__has_key="reserved")  # as does the reaper's, of a run never begun
        .exclude(metadata__has_key="unstarted")  # and a failure before the handler started
        .order_by("-id")
    )


def recovering_q() -> Q:
    """``recovering`` as a filter on jobs: one correlated look (by the history's job
    index, newest first) at each job the rest of the filter leaves."""
    last = _runs(OuterRef("pk")).annotate(action=KT("metadata__recovery")).values("action")[:1]
    # No mark (or no such row) reads as "wait": neither is a recovery run.
    action = Coalesce(Subquery(last, output_field=CharField()), Value("wait"), output_field=CharField())
    return ~Q(Exact(action, "wait"))


def recovery_action(pk: Any) -> str | None:
    """The ``recovery`` of the job's last requeue or cancel run (``recovering``), None
    when that row carries none."""
    last = _runs(pk).values_list("metadata", flat=True).first()
    if not isinstance(last, dict) or "recovery" not in last:
        return None
    return str(last["recovery"])


def mark_cancel_undos(job_id: Any, actor: Actor, now: datetime) -> bool:
    """Inside the worker's transaction that holds the job's lease: its run met its
    cancel as it ran (a step interrupted, or honouring ``check_cancelled``) and runs
    its undos now (``undo_on_cancel``). A ``compensate_cancel`` row with ``recovery:
    cancel`` marks the rest of the run as one that honours the cancel (``recovering``),
    as an operator's requeue of it keeps. Nothing is written (False) when the run is
    one already (it began for its undos). The job ends with this run (``cancelled``)
    or a newer requeue row says what its next run is, and a cancel request is never
    withdrawn, so no later ordinary run of the job inherits the mark."""
    if recovering(job_id):
        return False
    status = Status.PROCESSING
    record_event(job_id, status, status, CANCEL_UNDOS, actor, CANCEL_UNDOS_REASON, dict(CANCEL_RUN_MARK), now)
    return True
