"""A worker's hand-over from one job to its next: the outcome of the job it ran
and the claim of the next one in one statement.

A worker process that ends a job and goes on to another (``jobstate.worker.tasks.chain``)
would otherwise make two round trips and two commits: the outcome with its
history row, then the claim with its own. On PostgreSQL, when nothing else
belongs in either transaction (no cascade, no parent to wake, no hook that
writes), the two are one statement of four data-modifying parts: the guarded
outcome, its history row, the claim (which only takes a job if the outcome was
written) and the claim's history row. The outcome is refused exactly as on its
own (``LeaseLost``, ``InvalidTransition``), and then nothing is claimed.

A kind with a concurrency limit is never claimed here: its limit is counted
under a per-kind lock, in a transaction of its own (``claiming.claim``). The
statement picks the next ready job among all the kinds asked for, in claim
order, and takes it only if its kind has no limit; when it has one, nothing is
claimed and the worker claims on its own, through the claim that counts the
limit (the job picked and left was only locked until the commit). Taking the
next job of a kind without a limit instead would claim out of order.

Everywhere else the outcome is written as usual and nothing is claimed: the
worker then claims its next job itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from jobstate import registry
from jobstate.models import Job
from jobstate.services import _statements
from jobstate.services._rows import announce
from jobstate.services._writes import Event, jobs_from_rows, lease_times, update_statement, worker_label
from jobstate.services.actors import Actor
from jobstate.services.claiming import assignment_values, claim_ctes, claim_writes, kind_names, ready_sql
from jobstate.services.transitions import one_statement, refuse, transition_values, updated
from jobstate.states import Status


@dataclass
class NextClaim:
    """What to claim with an outcome: one ready job of ``kinds`` for the worker
    process ``worker_id``, begun at once (as ``claim(start=True)``). ``claimed``
    receives it; ``tried`` says whether the claim was made at all (False: the
    outcome could not take it, or the next ready job was of a kind with a
    concurrency limit, and the worker claims on its own).

    ``worker_id`` is a string and ``kinds`` a list of kind names (as ``claim``
    takes them; not None), else ``TypeError``, before the outcome is written."""

    worker_id: str
    kinds: list[str]
    claimed: list[Job] = field(default_factory=list)
    tried: bool = False

    def __post_init__(self) -> None:
        self.worker_id = worker_label(self.worker_id)
        kinds = kind_names(self.kinds)
        if kinds is None:
            raise TypeError("kinds is a list of kind names, not None")
        self.kinds = kinds


def possible(job: Any, name: str, actor: Actor, then: NextClaim, now: datetime) -> bool:
    """Whether moving ``job`` by ``name`` can take ``then``'s claim in the same statement."""
    conn = _statements.current()
    if conn.vendor != "postgresql" or not then.kinds or not isinstance(job, Job):
        return False
    target, sources, _values = transition_values(name, None, now)
    if len(sources) != 1 or not one_statement(job, sources[0], target, actor, Event("", target, name, actor)):
        return False
    limits = registry.concurrency_limits()
    if all(kind in limits for kind in then.kinds):
        return False  # nothing it could take
    return not claim_writes(Actor.worker(then.worker_id), now)


def move_and_claim(
    job: Job,
    name: str,
    *,
    actor: Actor,
    token: UUID | str,
    fields: dict[str, Any],
    reason: str,
    now: datetime,
    then: NextClaim,
) -> Job | None:
    """Apply the transition ``name`` to ``job`` (as ``transitions.move``) and claim
    ``then``'s next job, in one statement; call ``possible`` first."""
    conn = _statements.current()
    target, (source,), values = transition_values(name, fields, now)
    event = Event(source, target, name, actor, reason, None, now)
    moved, moved_params = update_statement(conn, job.pk, values, source, token, event=event, cte=True)
    claimer = Actor.worker(then.worker_id)
    # The next ready job of all the kinds asked for (locked), in claim order: taken
    # only if its kind has no concurrency limit (see the module's docstring).
    ready, ready_params = ready_sql(then.kinds, 1, now, True, cancel_free=True, columns="id, kind")
    limits = registry.concurrency_limits()
    limited = [kind for kind in then.kinds if kind in limits]
    picked, picked_params = "SELECT id FROM picked", list[Any]()
    if limited:
        picked, picked_params = "SELECT id FROM picked WHERE kind <> ALL(%s)", [limited]
    # The next job's lease from the database's clock, whatever dates the outcome.
    lease, _ = lease_times(None, vendor=conn.vendor)
    claim_values = assignment_values(then.worker_id, now, lease, True)
    claimed, claim_params = claim_ctes(
        picked, picked_params, claim_values, claimer, now, True, guard=" AND EXISTS (SELECT 1 FROM moved)"
    )
    rows = _statements.fetch(
        f"WITH {moved}, picked AS ({ready}), {claimed} "
        "SELECT m.n, p.n, c.* FROM (SELECT count(*) AS n FROM moved) m "
        "CROSS JOIN (SELECT count(*) AS n FROM picked) p LEFT JOIN claimed c ON true",
        [*moved_params, *ready_params, *claim_params],
        conn,
    )
    if not rows[0][0]:
        refuse(job.pk, name, target, token)
    # Handed over before anything else can raise: the claimed job is this worker's to run.
    # Tried unless a job was picked and not taken (its kind has a limit): the worker
    # then claims on its own.
    then.tried = rows[0][2] is not None or not rows[0][1]
    then.claimed = jobs_from_rows([row[2:] for row in rows if row[2] is not None], conn)
    committed = not conn.in_atomic_block
    announce(job.pk, source, target, name, actor, reason, now, committed=committed)
    for taken in then.claimed:
        announce(taken.pk, Status.QUEUED, Status.PROCESSING, "claim", claimer, now=now, committed=committed)
    return updated(job, values, target)
