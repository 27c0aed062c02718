"""Persisting state changes: one conditional UPDATE plus one JobEvent, atomically.

The allowed moves come from the ``@transition`` declarations on ``Job``; the
UPDATE's ``WHERE status IN (sources)`` makes the database, not Python, the
final judge, so two racing callers can never both win.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from jobstate import hooks
from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job
from jobstate.services import cascade
from jobstate.services._rows import announce, record_event
from jobstate.services._writes import Col, Event, update_job
from jobstate.services.actors import Actor
from jobstate.services.assets import lose_attempt_assets
from jobstate.states import ACTIVE, TERMINAL, Status

__all__ = [
    "REFUNDS",
    "all_transitions",
    "allowed_transitions",
    "announce",
    "held",
    "lock_parent",
    "move",
    "parent_locked",
    "record_event",
    "refunded",
    "sources_of",
    "target_of",
    "wake_parent_if_done",
]

logger = logging.getLogger("jobstate")


# The ``@transition`` methods on ``Job`` (django-fsm-2) are the one declaration of
# the state machine, but they are read here as a table, never called: calling one
# would check the source against the in-memory row, which another process may have
# changed since it was read, and could not carry the lease-token guard. ``move()``
# turns a declared transition into ``UPDATE ... WHERE pk = %s AND status IN
# (sources) [AND lease_token = %s]`` so the database decides, atomically.
def _meta(name: str) -> Any:
    method = getattr(Job, name, None)
    meta = getattr(method, "_django_fsm", None)
    if meta is None:
        raise ValueError(f"'{name}' is not a Job transition")
    return meta


# The declarations never change at run time: read once per transition name.
@functools.cache
def sources_of(name: str) -> tuple[str, ...]:
    return tuple(str(s) for s in _meta(name).transitions)


@functools.cache
def target_of(name: str) -> str:
    targets = {t.target for t in _meta(name).transitions.values()}
    (target,) = targets
    return str(target)


def all_transitions() -> list[tuple[str, str, str]]:
    """(source, target, name) for every declared transition, in declaration order."""
    field = Job._meta.get_field("status")
    return [(str(t.source), str(t.target), t.name) for t in field.get_all_transitions(Job)]


def allowed_transitions(status: str) -> list[str]:
    return [name for source, _target, name in all_transitions() if source == status]


# The history metadata keys of a move that ended a claim without spending an attempt:
# the reaper's requeue of a reservation, a hand-back, a Suspend, and any other end of
# a claim whose attempt was never begun (``started_at`` NULL: ``move`` adds it).
REFUNDS = ("reserved", "handed_back", "suspended", "unstarted")

# Moves that store a result: the claim that made one did the work, begun or not, so it
# is never marked unstarted (no claim to look at).
_HANDLER_MOVES = frozenset({"complete", "mark_partial"})


def refunded(metadata: dict[str, Any] | None) -> bool:
    """Whether a history row that ended a claim says its attempt was not spent."""
    return any((metadata or {}).get(key) for key in REFUNDS)


def move(
    job: Job | UUID | str,
    name: str,
    *,
    actor: Actor,
    token: UUID | str | None = None,
    reason: str = "",
    fields: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    condition: Q | None = None,
    now: datetime | None = None,
    begun: bool | None = None,
) -> Job | None:
    """Apply the declared transition ``name`` to ``job`` and record it; raise if refused.

    ``token`` (when given) must match the job's lease token, ``condition`` is an
    extra guard on the row. A refused move raises ``InvalidTransition`` or
    ``LeaseLost`` and writes nothing. A job that ends ``failed`` or ``cancelled``
    ends its active children first (``cascade``). Returns the in-memory job,
    updated, when one was passed.

    A move that takes a job out of ``processing`` whose attempt was never begun
    (a reserved claim: ``started_at`` NULL, no attempt charged), whoever makes it,
    marks its history row ``unstarted`` (``REFUNDS``), so what counts attempts
    from the history (``jobstate.tasks``) counts that claim in none; but for
    ``complete`` and ``mark_partial``, which a worker makes only once ``begin``
    charged the attempt: a script that claims and completes without ``begin``
    leaves its claim counted in the history (its task result shows the attempt that
    produced its result, by that script), though ``attempts``, which only ``begin``
    charges, stays as it was. The
    row lock is ``FOR NO KEY UPDATE``: rows that point at the job (history, assets,
    children) can still be inserted meanwhile, as during the plain UPDATE.
    ``begun``: whether the attempt was begun (what the move leaves in ``started_at``
    aside), as a caller holding the row's lock read it; None: read here, under the
    row's lock, when it may matter.

    Internal: ``now`` is taken as given; each public function that reaches it
    checks a caller's ``now`` first (``_writes.checked_now``).
    """
    now = now or timezone.now()
    target, sources, values = transition_values(name, fields, now)
    job_id = job.pk if isinstance(job, Job) else job
    plain = condition is None and not any(hasattr(v, "resolve_expression") for v in values.values())
    ends_claim = (
        Status.PROCESSING in sources
        and target != Status.PROCESSING
        and name not in _HANDLER_MOVES
        and not refunded(metadata)
    )
    if ends_claim and begun is False:
        metadata = {**(metadata or {}), "unstarted": True}
    read_claim = ends_claim and begun is None  # started_at is read with the row's lock
    event = Event("", target, name, actor, reason, metadata, now)
    single = len(sources) == 1 and not read_claim
    if plain and single and one_statement(job, sources[0], target, actor, event):
        # Nothing else to do in the transaction (no cascade, no lost assets, no
        # parent, no hook that writes): the row and its history in one
        # autocommitted statement (PostgreSQL), the hooks told right after.
        event = event._replace(from_status=sources[0])
        if not update_job(job_id, values, status=sources[0], token=token, event=event):
            refuse(job_id, name, target, token)
        announce(
            job_id, sources[0], target, name, actor, reason, now, committed=not connection.in_atomic_block
        )
        return updated(job, values, target)
    with transaction.atomic():
        # Parents before children (see lock_parent): this job may wake its parent.
        parent_id = lock_parent(job) if target in TERMINAL else None
        qs = Job.objects.filter(pk=job_id)
        if token is not None:
            qs = qs.filter(lease_token=token)
        if condition is not None:
            qs = qs.filter(condition)
        if single:
            from_status = sources[0]
        else:
            row = qs.select_for_update(no_key=True).values_list("status", "started_at").first()
            if row is None or row[0] not in sources:
                refuse(job_id, name, target, token)
            from_status = str(row[0])
            if read_claim and from_status == Status.PROCESSING and row[1] is None:
                metadata = {**(metadata or {}), "unstarted": True}
                event = event._replace(metadata=metadata)
        if _loses_assets(from_status, target, actor):
            # The attempt did not end by its own worker (reaped, or taken by an
            # operator): what it stored is not part of the job's results.
            lose_attempt_assets(job_id)
        if target in (Status.FAILED, Status.CANCELLED):
            # After this row's lock: a worker creating children holds it until they
            # are committed, so all of them are seen. Rolled back with the rest if the
            # UPDATE below is refused. A child's final transaction locks this row
            # before its own (lock_parent), so the two cannot deadlock.
            cascade.end_children(job_id, why=target, actor=actor, now=now)
        if plain:
            event = event._replace(from_status=from_status)
            written = update_job(job_id, values, status=from_status, token=token, event=event)
        else:
            written = qs.filter(status=from_status).update(**values)
            if written:
                record_event(job_id, from_status, target, name, actor, reason, metadata, now, announced=False)
        if not written:
            refuse(job_id, name, target, token)
        announce(job_id, from_status, target, name, actor, reason, now)
        if parent_id is not None:
            wake_parent_if_done(parent_id, now)
    return updated(job, values, target)


def lock_parent(job: Job | UUID | str) -> Any:
    """Lock the row of ``job``'s parent, if it has one; returns the parent's id.

    The lock order of job rows is parents before children: a job that ends
    ``failed`` or ``cancelled`` (``move``), and a cancel request on a running job
    (``control``), lock the job, then its children (``cascade``). So a transaction
    that may end a child, and then wake its parent, calls this first, before it
    locks or writes the child's row; otherwise the two could each hold the row
    the other waits for (PostgreSQL would abort one). Only jobs with a parent pay
    for it. Calling it again in the same transaction is harmless (the lock is taken
    again without waiting) but costs a statement: inside ``parent_locked`` it is not."""
    if isinstance(job, Job) and not job._state.adding:  # a row read from the database
        parent_id = job.parent_id
    else:
        pk = job.pk if isinstance(job, Job) else job
        parent_id = Job.objects.filter(pk=pk).values_list("parent_id", flat=True).first()
    if (
        parent_id is not None
        and parent_id not in _held_parents.get()
        and connection.features.has_select_for_update
    ):
        list(Job.objects.filter(pk=parent_id).select_for_update(no_key=True).values_list("pk", flat=True))
    return parent_id


# Parents whose rows the current transaction locked in an enclosing ``parent_locked``.
_held_parents: ContextVar[frozenset[Any]] = ContextVar("jobstate_held_parents", default=frozenset())


@contextmanager
def parent_locked(job: Job | UUID | str) -> Iterator[Any]:
    """``lock_parent(job)`` for a block inside a transaction (enter it after the
    ``atomic()``): the calls in the block (``fail``, ``move``) lock it no more. The
    lock was taken before any savepoint of the block, so it is held to its end.
    Outside a transaction Django refuses the lock (TransactionManagementError), so a
    lock that ended with its statement is never marked held."""
    parent_id = lock_parent(job)
    held = _held_parents.get()
    reset = _held_parents.set(held if parent_id is None else held | {parent_id})
    try:
        yield parent_id
    finally:
        _held_parents.reset(reset)


def _loses_assets(from_status: str, target: str, actor: Actor) -> bool:
    return (
        from_status == Status.PROCESSING and target != from_status and not actor.label.startswith("worker:")
    )


def transition_values(
    name: str, fields: dict[str, Any] | None, now: datetime
) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """The declared transition ``name``'s target and sources, and the values it
    writes with ``fields`` (the lease dropped when it leaves ``processing``)."""
    target = target_of(name)
    values: dict[str, Any] = {"status": target, "updated_at": now, **(fields or {})}
    if target in TERMINAL:
        values.setdefault("finished_at", now)
    if target != Status.PROCESSING:
        values.setdefault("lease_token", None)
        values.setdefault("lease_expires_at", None)
    return target, sources_of(name), values


def one_statement(job: Job | UUID | str, source: str, target: str, actor: Actor, event: Event) -> bool:
    """Whether a plain single-source move can be one autocommitted statement (on
    PostgreSQL: nothing else belongs in its transaction)."""
    if connection.vendor != "postgresql":
        return False
    if _loses_assets(source, target, actor) or target in (Status.FAILED, Status.CANCELLED):
        return False
    if target in TERMINAL and not (isinstance(job, Job) and job.parent_id is None):
        return False
    if connection.in_atomic_block:
        return True  # the caller's transaction holds the hooks' writes too
    pk = job.pk if isinstance(job, Job) else job
    change = hooks.Transition(pk, source, target, event.name, actor.label, event.reason or "", event.now)
    return not hooks.transitioned.writes(change)


def updated(job: Job | UUID | str, values: dict[str, Any], target: str) -> Job | None:
    """The caller's Job object, if one was passed, with the values a move wrote."""
    if isinstance(job, Job):
        for attr, value in values.items():
            if attr != "status" and not hasattr(value, "resolve_expression") and not isinstance(value, Col):
                setattr(job, attr, value)
        Job._meta.get_field("status").set_state(job, target)
        return job
    return None


# Set by a caller whose run may already have stored its outcome (the Ctrl-C hand-back):
# its guard refusing a job that left processing is that normal race, not a lost lease.
_outcome_may_be_stored: ContextVar[bool] = ContextVar("jobstate_outcome_may_be_stored", default=False)


@contextmanager
def outcome_may_be_stored() -> Iterator[None]:
    reset = _outcome_may_be_stored.set(True)
    try:
        yield
    finally:
        _outcome_may_be_stored.reset(reset)


def held(job_id: Any, token: UUID | str | None, name: str) -> UUID | str:
    """``token`` as a call that holds a lease carries it (a worker's outcome):
    None (a lease never taken, or a job copy a stored outcome cleared) is refused
    with ``LeaseLost``, nothing written, where ``move`` would read it as "no lease
    check" and let a stale worker's write through."""
    if token is None:
        logger.warning("Refused %s on job %s: no lease token given", name, job_id)
        raise LeaseLost(job_id, "no lease token given")
    return token


def refuse(job_id: Any, name: str, target: str, token: Any) -> NoReturn:
    row = Job.objects.filter(pk=job_id).values_list("status", "lease_token").first()
    if row is None:
        raise Job.DoesNotExist(f"Job {job_id} does not exist")
    status, lease_token = row
    if token is not None and (str(lease_token) != str(token) or status != Status.PROCESSING):
        if status != Status.PROCESSING and _outcome_may_be_stored.get():
            logger.info("Refused %s on job %s: it is already %s", name, job_id, status)
        else:
            logger.warning("Refused %s on job %s: lease token does not match", name, job_id)
        raise LeaseLost(job_id)
    raise InvalidTransition(status, target, name)


def wake_parent_if_done(parent_id: Any, now: datetime | None = None) -> bool:
    """Wake a ``waiting`` parent (``wake``: -> ``queued``) once none of its children
    is active; until then, let a hook keep a waiting parent's progress in step with
    its children."""
    now = now or timezone.now()
    _serialize_wakeups(parent_id)
    active = Job.objects.filter(parent_id=parent_id, status__in=ACTIVE)
    if active.exists():
        if hooks.waiting_progress:
            _waiting_progress(parent_id, active, now)
        return False
    if not Job.objects.filter(pk=parent_id, status=Status.WAITING).exists():
        return False
    try:
        move(
            parent_id,
            "wake",
            actor=Actor.system("children done"),
            reason="its last active child ended",
            fields={"run_after": now},
            now=now,
        )
    except InvalidTransition:
        return False  # cancelled or failed meanwhile
    return True


def _serialize_wakeups(parent_id: Any) -> None:
    """PostgreSQL: a child's final transaction and its parent's ``suspend`` both take
    this lock before looking at the children, so whichever commits second sees the
    other's change: a parent can never go to sleep after its last child's wake-up."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"jobstate:wake:{parent_id}"])


def _waiting_progress(parent_id: Any, active: Any, now: datetime) -> None:
    """A waiting parent has no lease to report progress with: the ``waiting_progress``
    hook (jobstate.workflows, for a fan-out step) says what it shows."""
    waiting = Job.objects.filter(pk=parent_id, status=Status.WAITING)
    # Cosmetic: skip it rather than wait for a parent row someone else is changing
    # (a cancel that cascades to this child's row would deadlock with us).
    if not waiting.select_for_update(skip_locked=True).values_list("pk", flat=True):
        return
    counts = active.aggregate(n=Count("pk"), p=Sum("progress"))
    shown = hooks.waiting_progress.ask(hooks.Waiting(parent_id, counts["n"], counts["p"] or 0))
    if shown is None:
        return
    percent, message = shown
    waiting.update(progress=max(0, min(100, int(percent))), progress_message=message[:500], updated_at=now)
