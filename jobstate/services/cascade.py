"""A job that ends ``failed`` or ``cancelled`` ends its active children.

Queued and waiting children are cancelled at once; processing ones are asked to
cancel (``cancel_requested_at``: their worker ends them, or the reaper if it is
gone). A child whose cancel needs one more run (``hooks.cancelling``: a workflow
with ``undo_on_cancel`` and undos to run) is queued for it instead, as a cancel
of it alone would (``undo_runs``). Each gets a history row naming
the parent. A fan-out of n children costs a fixed number of statements per level
(bulk UPDATE, bulk history insert), not n transitions each looking at its
siblings: cancelling 10,000 children takes seconds (``bench/cancel_fanout.py``);
the hook costs no statement for a child whose kind has no such option.

Lock order, parents before children: ``services.transitions.move`` locks the
parent's row, then this locks the children (so children a worker is still
creating are seen); a child's own final transaction locks its parent's row before
its own (``transitions.lock_parent``), then wakes the parent if it was the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from jobstate import hooks
from jobstate.models import Job
from jobstate.services._rows import record_event, record_events
from jobstate.services.actors import Actor
from jobstate.services.recovery_runs import CANCEL_RUN_MARK, recovering
from jobstate.states import ACTIVE, Status

# Children updated per statement.
CHUNK = 2000


def to_end(parent_id: Any) -> QuerySet[Job]:
    """The children ``end_children`` ends now: queued or waiting (cancelled), or
    running and not yet asked to stop (asked); not locked (for a count)."""
    return Job.objects.filter(parent_id=parent_id).filter(
        Q(status__in=(Status.QUEUED, Status.WAITING))
        | Q(status=Status.PROCESSING, cancel_requested_at__isnull=True)
    )


def end_children(parent_id: Any, *, why: str, actor: Actor, now: datetime) -> int:
    """End every active child of ``parent_id`` (and, first, their own active
    children); returns how many children were cancelled or asked to cancel."""
    children = list(
        Job.objects.filter(parent_id=parent_id, status__in=ACTIVE)
        .order_by("pk")
        .select_for_update()
        .values_list("pk", "status", "kind", "started_at", "cancel_requested_at")
    )
    if not children:
        return 0
    ids = [child[0] for child in children]
    # Grandchildren first, still children before parents.
    for chunk in _chunks(ids):
        nested = (
            Job.objects.filter(parent_id__in=chunk, status__in=ACTIVE)
            .order_by()
            .values_list("parent_id", flat=True)
            .distinct()
        )
        for child_id in sorted(set(nested), key=str):
            end_children(child_id, why=Status.CANCELLED, actor=actor, now=now)
    reason = f"parent {parent_id} {why}"
    metadata = {"parent": str(parent_id), "cascade": why}
    ended = 0
    if hooks.cancelling:
        given, ended = undo_runs(children, reason, metadata, actor, now)
        children = [child for child in children if child[0] not in given]
    for status in (Status.QUEUED, Status.WAITING):
        pks = [pk for pk, s, *_rest in children if s == status]
        for chunk in _chunks(pks):
            done = list(
                Job.objects.filter(pk__in=chunk, status=status).values_list("pk", flat=True)
            )  # still in that state (we hold their locks)
            Job.objects.filter(pk__in=done, status=status).update(
                status=Status.CANCELLED,
                finished_at=now,
                updated_at=now,
                lease_token=None,
                lease_expires_at=None,
            )
            record_events(done, status, Status.CANCELLED, "cancel", actor, reason, metadata, now)
            ended += len(done)
    running = [pk for pk, s, *_rest in children if s == Status.PROCESSING]
    for chunk in _chunks(running):
        asked = list(
            Job.objects.filter(
                pk__in=chunk, status=Status.PROCESSING, cancel_requested_at__isnull=True
            ).values_list("pk", flat=True)
        )
        Job.objects.filter(Q(pk__in=asked), cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, updated_at=now
        )
        record_events(
            asked, Status.PROCESSING, Status.PROCESSING, "request_cancel", actor, reason, metadata, now
        )
        ended += len(asked)
    return ended


def _chunks(ids: list[Any]) -> list[list[Any]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


# A child as ``cascade.end_children`` read it, its row locked:
# (pk, status, kind, started_at, cancel_requested_at).
Child = tuple[Any, str, str, datetime | None, datetime | None]


def undo_runs(
    children: Sequence[Child], reason: str, metadata: dict[str, Any], who: Actor, now: datetime
) -> tuple[set[Any], int]:
    """Inside ``cascade.end_children``'s transaction, the children's rows locked and
    their own children ended: give each queued or waiting child (or one reserved and
    not begun, as ``request_cancel`` does) the run its cancel needs, as
    ``cancel_runs.run_first`` would. Returns the ids of the children that have it now (the cascade leaves them
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
        marked = {**metadata, **CANCEL_RUN_MARK}
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
