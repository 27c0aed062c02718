"""What people and the system do to jobs: cancel, retry, requeue, rescue."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from jobstate import hooks
from jobstate.exceptions import (
    DuplicateActiveKey,
    InvalidTransition,
)
from jobstate.models import Job, JobEvent
from jobstate.services import cancel_runs, cascade
from jobstate.services._rows import JobRef, record_event
from jobstate.services._rows import get_job as _get
from jobstate.services._writes import checked_time
from jobstate.services.actors import Actor
from jobstate.services.recovery_runs import CANCEL_RUN_MARK, recovering, recovery_action
from jobstate.services.transitions import (
    allowed_transitions,
    held,
    lock_parent,
    move,
    outcome_may_be_stored,
    wake_parent_if_done,
)
from jobstate.states import ACTIVE, TERMINAL, Status

logger = logging.getLogger("jobstate")

__all__ = [
    "DuplicateActiveKey",  # re-exported: it lives in jobstate.exceptions
    "JobRef",
    "cancel_now",
    "cancel_run_pending",
    "force_cancel",
    "force_fail",
    "operator_actions",
    "request_cancel",
    "request_stop",
    "requeue",
    "suspend",
]

# Statuses a cancel ends at once (no worker holds the job).
IDLE = (Status.QUEUED, Status.WAITING)


# Passes of request_cancel: each follows one change of status made meanwhile
# by someone else (claimed, suspended, woken), which takes a worker's or a
# child's transaction each; three in a row is a job moving faster than a person
# can cancel it, and the caller sees its status.
CANCEL_PASSES = 3


class _StatusMoved(Exception):
    """The job left ``processing`` before the cancel request was stored."""


def request_cancel(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """Cancel a queued or waiting job at once; ask a processing one to stop.

    The request on a processing job is stored (it survives restarts) and
    recorded in the history; its worker ends it ``cancelled``. Active children
    are cancelled too. Terminal jobs raise ``InvalidTransition``. A queued or
    waiting workflow with ``undo_on_cancel`` and undos to run keeps the request
    and is queued for a run that runs them, then ends ``cancelled``
    (``cancel_runs``); one a cluster reserved but has not begun keeps it
    reserved, its request row marked for that run; a second request leaves
    that run be.
    """
    who = Actor.of(actor)
    now = timezone.now()
    current = _get(job)
    # The status read here is only a guess: a worker may claim the job, or the job
    # suspend, end or be woken, before our writes. Each write below is conditional
    # on the status it was chosen for; one that finds another status rolls back
    # (the children it ended included) and the next pass looks again.
    for _ in range(CANCEL_PASSES):
        if current.status in TERMINAL:
            raise InvalidTransition(current.status, Status.CANCELLED, "cancel")
        try:
            with transaction.atomic():
                if current.status in IDLE:
                    if hooks.cancelling and cancel_runs.run_first(current, who, reason, now):
                        return _get(current.pk)  # its cancel waits for one more run
                    # Never from processing here: that job's worker must be asked.
                    move(current, "cancel", actor=who, reason=reason, now=now, condition=Q(status__in=IDLE))
                    return _get(current.pk)
                _ask_to_cancel(current.pk, who, reason, now)
                return _get(current.pk)
        except (InvalidTransition, _StatusMoved, cancel_runs.StatusMoved):
            current = _get(current.pk)
    raise InvalidTransition(current.status, Status.CANCELLED, "cancel")


def _ask_to_cancel(job_id: Any, who: Actor, reason: str, now: datetime) -> None:
    """Store a cancel request on a processing job and end its active children.
    The job's row is locked first (parents before children, the order of every
    transaction that locks both: see ``transitions.lock_parent``); a worker still
    creating children holds it until they are committed, so all of them are seen.
    Raises ``_StatusMoved`` if the job is no longer processing."""
    processing = Job.objects.filter(pk=job_id, status=Status.PROCESSING)
    found = list(processing.select_for_update(no_key=True).values_list("kind", "started_at"))
    if not found:
        raise _StatusMoved
    cascade.end_children(job_id, why=Status.CANCELLED, actor=who, now=now)
    if processing.filter(cancel_requested_at__isnull=True).update(cancel_requested_at=now, updated_at=now):
        kind, started = found[0]
        # Only reserved (not begun), the job is as good as queued: ``begin`` and the
        # reaper give it the run its cancel needs (``hooks.cancelling``) by this row.
        why = None
        if started is None and hooks.cancelling:
            why = hooks.cancelling.ask(hooks.Cancelling(job_id, kind, str(Status.QUEUED)))
        if why is not None:
            text = f"{reason}; {why}" if reason else f"cancel requested; {why}"
            record_event(
                job_id,
                Status.PROCESSING,
                Status.PROCESSING,
                "request_cancel",
                who,
                text[:1000],
                CANCEL_RUN_MARK,
                now,
            )
        else:
            record_event(job_id, Status.PROCESSING, Status.PROCESSING, "request_cancel", who, reason, {}, now)
    # Otherwise it was asked already: the first request stands.


def cancel_now(
    job: Job,
    token: UUID | str,
    *,
    reason: str = "",
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
) -> Job | None:
    """The worker honours a cancel request: ``processing`` -> ``cancelled``.
    ``progress``: progress fields not yet written, stored with it (as in ``complete``).
    A ``token`` of None is refused (``LeaseLost``), nothing written."""
    token = held(job.pk, token, "cancel")
    row = Job.objects.filter(pk=job.pk).values_list("cancel_requested_at", flat=True).first()
    return move(
        job,
        "cancel",
        actor=actor or Actor.worker(job.worker_id),
        token=token,
        reason=reason or "cancel requested",
        fields=progress,
        metadata={"requested_at": row.isoformat() if row else None},
    )


def force_cancel(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """An operator honours a pending cancel request now, on behalf of a worker that has
    not (lost or hung): ``cancel_now`` with the job's current lease token, so that
    worker's lease stops working; if the worker ended the job meanwhile, the token no
    longer matches and nothing is written (``LeaseLost``). Only a job whose cancel was
    requested (else ``InvalidTransition``): without a request this would end a healthy
    running job at once, its handler never asked to stop. A queued job with a cancel
    request (left by an operator's requeue, or waiting for the run its cancel needs, a
    workflow's undos, ``cancel_runs``, that no worker takes) ends ``cancelled`` at once;
    when that run was pending, the history reason says the undos did not run."""
    fresh = _get(job)
    if fresh.status == Status.QUEUED and fresh.cancel_requested_at is not None:
        why = None
        if cancel_run_pending(fresh):
            why = "cancelled without the run its cancel was queued for (a workflow's undos not run)"
        text = f"{reason}; {why}" if reason and why else (reason or why or "cancel requested")
        move(
            fresh,
            "cancel",
            actor=Actor.of(actor),
            reason=text[:1000],
            condition=Q(status=Status.QUEUED, cancel_requested_at__isnull=False),
        )
        return _get(fresh.pk)
    if fresh.status != Status.PROCESSING or fresh.lease_token is None or fresh.cancel_requested_at is None:
        raise InvalidTransition(fresh.status, Status.CANCELLED, "force_cancel")
    cancel_now(fresh, fresh.lease_token, reason=reason, actor=Actor.of(actor))
    return _get(fresh.pk)


def cancel_run_pending(job: Job) -> bool:
    """Whether ``job`` (as read) is queued with a cancel request for the run its cancel
    needs (a workflow's undos: ``cancel_runs``), which ``force_cancel`` ends without."""
    return job.status == Status.QUEUED and job.cancel_requested_at is not None and recovering(job.pk)


def request_stop(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """Ask a service-style job to stop gracefully; it then ends ``completed``.

    The request is stored (``stop_requested_at`` and a ``request_stop`` event) on a
    processing job, and on a queued one that has served (a step of it reached
    ``serving``; it now waits for a retry, a rescue or its children): when it runs
    again, ``wait_for_stop`` returns at once. A queued job that never served has
    nothing to stop: it is cancelled, its active children with it (``request_cancel``).
    A job that has ended (before the call or during it) raises ``InvalidTransition``.
    """
    who = Actor.of(actor)
    current = _get(job)
    if current.status not in ACTIVE:
        raise InvalidTransition(current.status, Status.COMPLETED, "stop")
    if current.status in IDLE and not _has_served(current.pk):
        try:
            return request_cancel(current, who, reason or "stopped before it served")
        except InvalidTransition as exc:
            raise InvalidTransition(exc.current, Status.COMPLETED, "stop") from None
    now = timezone.now()
    with transaction.atomic():
        stored = Job.objects.filter(pk=current.pk, status__in=ACTIVE, stop_requested_at__isnull=True).update(
            stop_requested_at=now, updated_at=now
        )
        status = Job.objects.filter(pk=current.pk).values_list("status", flat=True).get()
        if stored:
            record_event(current.pk, status, status, "request_stop", who, reason, {}, now)
        elif status in TERMINAL:
            # It ended after our read: there is nothing left to stop.
            raise InvalidTransition(status, Status.COMPLETED, "stop")
        # Otherwise a stop was requested already: the first request stands.
    return _get(current.pk)


def _has_served(job_id: Any) -> bool:
    return JobEvent.objects.filter(job_id=job_id, transition="step_serving").exists()


# The move an operator's requeue makes, by the job's status.
REQUEUE_MOVES = {Status.PROCESSING: "requeue", Status.WAITING: "wake"}


def operator_actions(status: str) -> frozenset[str]:
    """What an operator may ask of a job in ``status``: "cancel" (``request_cancel``),
    "retry", "requeue" and "fail" (``force_fail``), as those functions decide by the
    status (each may still refuse for other reasons: a retry made already, a parent
    that ended, a key in use). The API's ``allowed_actions`` reads this."""
    moves = set(allowed_transitions(status))
    actions: set[str] = {name for name in ("cancel", "fail") if name in moves}
    if REQUEUE_MOVES.get(Status(status)) in moves:
        actions.add("requeue")
    if status in TERMINAL:
        actions.add("retry")
    return frozenset(actions)


def requeue(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """An operator puts a processing job back in the queue (e.g. a stuck one).

    The old worker's token stops working, but its handler may still run: the job is
    not claimed again before its old lease would have run out (``run_after`` = the
    old ``lease_expires_at``, when later than now), by when that worker's watchdog
    has interrupted it (its heartbeat is refused, or cannot renew the lease; one deaf
    to it runs up to ``INTERRUPT_GRACE_SECONDS`` more), as the workers' clocks agree
    with the database's. A job whose lease expired, or reserved and never begun, runs
    again at once.
    If no attempt is left, one more is granted.
    A ``waiting`` job is woken (``wake``): it runs again now, whatever its children do.
    """
    current = _get(job)
    if REQUEUE_MOVES.get(Status(current.status)) == "wake":
        move(
            current,
            "wake",
            actor=Actor.of(actor),
            reason=reason or "woken by operator",
            fields={"run_after": timezone.now()},
        )
        return _get(current.pk)
    # One more attempt if none is left, judged on the row as the UPDATE finds it: a
    # reserved job may begin (and spend an attempt) after our read.
    # The old lease as the UPDATE finds it (a heartbeat may renew it after our read).
    now = timezone.now()
    fields: dict[str, Any] = {
        # A reserved job never begun has no handler running: at once.
        "run_after": Case(
            When(started_at__isnull=True, then=Value(now, output_field=DateTimeField())),
            default=Greatest(F("lease_expires_at"), Value(now, output_field=DateTimeField())),
        ),
        "worker_id": "",
        "max_attempts": Greatest(F("max_attempts"), F("attempts") + 1),
    }
    # The run of a workflow's undos (a hung one) stays one: its next run finishes them
    # despite the cancel request, as after the reaper's recovery requeue.
    action = recovery_action(current.pk) if current.cancel_requested_at is not None else None
    metadata: dict[str, Any] | None = None
    if action is not None and action != "wait":
        metadata = {"recovery": action, "operator": True}
    elif current.cancel_requested_at is not None and action in (None, "wait") and hooks.cancelling:
        # A run that met its cancel as it ran marks itself once its undos begin
        # (``compensate_cancel``); one that hung before (a step deaf to the cancel), or
        # begun by an older release, has no mark (an earlier run's "wait" may be the
        # newest): the workflow says whether its undos are left to run.
        asked = hooks.cancelling.ask(hooks.Cancelling(current.pk, current.kind, str(current.status)))
        metadata = {**CANCEL_RUN_MARK, "operator": True} if asked is not None else None
    move(
        current,
        "requeue",
        actor=Actor.of(actor),
        reason=reason or "requeued by operator",
        fields=fields,
        metadata=metadata,
    )
    return _get(current.pk)


def force_fail(job: JobRef, actor: Actor | str | Any | None = None, reason: str = "") -> Job:
    """An operator ends a queued, waiting or processing job ``failed`` with a reason;
    its active children are cancelled, each with a history row naming it."""
    message = reason or "failed by operator"
    move(
        _get(job),
        "fail",
        actor=Actor.of(actor),
        reason=message,
        fields={"error_message": message, "error_type": "OperatorFailed"},
    )
    return _get(job)


def _refund() -> Case:
    """The attempts a job keeps when it gives its worker back: one fewer if one was
    charged (a job merely reserved by a cluster, never begun, has not spent one)."""
    return Case(
        When(started_at__isnull=False, then=F("attempts") - 1),
        default=F("attempts"),
        output_field=Job._meta.get_field("attempts"),
    )


def hand_back(
    job: Job,
    token: UUID | str,
    *,
    reason: str,
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
    stopped_run: bool = False,
) -> Job | None:
    """A job its worker claimed but whose handler never started (or whose inline
    run the operator stopped: Ctrl-C) goes back to the queue, ready at once, its
    attempt (if charged) refunded. ``progress`` as in ``cancel_now``.
    ``stopped_run``: the run may have stored its outcome just before the stop, so a
    refusal because the job left ``processing`` is logged at INFO, not as a lost lease.
    A ``token`` of None is refused (``LeaseLost``), nothing written."""
    token = held(job.pk, token, "requeue")
    with outcome_may_be_stored() if stopped_run else nullcontext():
        return move(
            job,
            "requeue",
            actor=actor or Actor.worker(job.worker_id),
            token=token,
            reason=reason,
            fields={**(progress or {}), "attempts": _refund(), "worker_id": "", "run_after": timezone.now()},
            metadata={"handed_back": True},
        )


def suspend(
    job: Job,
    token: UUID | str,
    *,
    until: datetime | None = None,
    reason: str = "",
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
) -> Job | None:
    """Give the worker back while the job waits, without spending an attempt.

    With ``until``: ``processing`` -> ``queued`` (``requeue``), runnable from then.
    Without: ``processing`` -> ``waiting`` (``suspend``) until its last active
    child ends, which wakes it (``wake``: -> ``queued``); at once if none is active.
    A cancel requested while it ran is honoured instead: ``cancelled``, or
    ``queued`` for the run its cancel needs (``hooks.cancelling``: a workflow's
    undos), its attempt refunded.
    ``progress`` as in ``cancel_now``, stored with either. A ``token`` of None is
    refused (``LeaseLost``), nothing written.
    """
    until = checked_time(until, "until")
    token = held(job.pk, token, "suspend")
    who = actor or Actor.worker(job.worker_id)
    fields: dict[str, Any] = {**(progress or {}), "attempts": _refund(), "worker_id": ""}
    with transaction.atomic():
        lock_parent(job)  # a cancel may end it: parents before children
        # The row lock keeps a cancel request from landing between the check and the move.
        requested = (
            Job.objects.select_for_update(no_key=True)
            .filter(pk=job.pk)
            .values_list("cancel_requested_at", flat=True)
            .first()
        )
        if requested is not None:
            undo = hooks.cancelling.ask(hooks.Cancelling(job.pk, job.kind, str(Status.PROCESSING)))
            if undo is not None:
                # Its run for the cancel (``cancel_runs``): the request came as it suspended.
                return move(
                    job,
                    "requeue",
                    actor=who,
                    token=token,
                    reason=f"{undo} (the handler suspended)",
                    fields={**fields, "run_after": timezone.now()},
                    # Marked as suspended too, as the ordinary suspend: a lost answer is
                    # then read as stored, its attempt refunded (``REFUNDS``).
                    metadata={**CANCEL_RUN_MARK, "suspended": True},
                )
            why = f"cancel requested; the handler suspended ({reason})" if reason else "cancel requested"
            return cancel_now(job, token, reason=why[:1000], actor=who, progress=progress)
        if until is not None:
            return move(
                job,
                "requeue",
                actor=who,
                token=token,
                reason=reason or "waiting",
                fields={**fields, "run_after": until},
                metadata={"suspended": True},
            )
        moved = move(
            job,
            "suspend",
            actor=who,
            token=token,
            reason=reason or "waiting for its children",
            fields=fields,
            metadata={"suspended": True},
        )
        if wake_parent_if_done(job.pk):
            # Its children all ended before it suspended.
            job.run_after = timezone.now()
            Job._meta.get_field("status").set_state(job, Status.QUEUED)
    return moved
