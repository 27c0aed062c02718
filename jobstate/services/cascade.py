"""A job that ends ``failed`` or ``cancelled`` ends its active children.

Queued and waiting children are cancelled at once; processing ones are asked to
cancel (``cancel_requested_at``: their worker ends them, or the reaper if it is
gone). A child whose cancel needs one more run (``hooks.cancelling``: a workflow
with ``undo_on_cancel`` and undos to run) is queued for it instead, as a cancel
of it alone would (``cancel_runs.for_children``). Each gets a history row naming
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

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from jobstate import hooks
from jobstate.models import Job
from jobstate.services._rows import record_events
from jobstate.services.actors import Actor
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
        # Imported here: cancel_runs imports the transitions, which import this module.
        from jobstate.services import cancel_runs

        given, ended = cancel_runs.for_children(children, reason, metadata, actor, now)
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
