"""Claiming ready jobs: ``claim`` reserves a batch in one round trip.

Split from ``lease`` (what a worker does with a job it holds) to keep each
module small; ``jobstate.services.lease.claim`` and ``jobstate.services.claim``
are this function.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from jobstate import hooks, registry
from jobstate.models import Job, JobEvent, KindPause
from jobstate.models.job import LeaseClock
from jobstate.services import _statements
from jobstate.services._writes import checked_limit, job_columns, jobs_from_rows, lease_times, worker_label
from jobstate.services.actors import Actor
from jobstate.services.transitions import announce
from jobstate.states import Status
from jobstate.storable import text


def claim(
    worker_id: str,
    kinds: list[str] | None = None,
    limit: int = 1,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
    start: bool = False,
) -> list[Job]:
    """Atomically take up to ``limit`` ready jobs, each under a fresh lease token.

    One round trip for the whole batch: on PostgreSQL a single statement locks
    the candidates (``FOR UPDATE SKIP LOCKED``), reserves them and writes their
    ``claim`` history rows; on SQLite, whose IMMEDIATE transactions serialize
    claimers, an ``UPDATE ... RETURNING`` that re-checks the status, then one
    bulk insert of the history rows. Per-kind concurrency limits count
    processing jobs under a per-kind lock first, so they hold across every
    worker and machine. A claimed job is reserved, not running: ``begin``
    charges the attempt and sets ``started_at`` when a worker starts it.
    With ``start=True`` (a worker process taking its own next job) the same
    statement also begins them: ``started_at`` set and the attempt charged.
    Returned in claim order (priority, then ``run_after``, then age). The lease
    runs from the database's clock on PostgreSQL unless ``now`` is given
    (``_writes.lease_times``): with ``USE_TZ = True`` a timezone-aware one, else
    ``ValidationError``, as in every call here that takes one.

    ``worker_id`` is a string (``TypeError``). ``kinds`` is a list of kind names
    (None: every kind); a string, or a name that is not one, is a ``TypeError``.
    ``lease_seconds`` (None: ``LEASE_SECONDS``) is more than 0 and at most a year,
    else ``ValueError``. ``limit`` is an integer (``TypeError``) from 0 (nothing
    claimed) to ``MAX_LIMIT`` (``ValueError``).
    """
    worker_id = worker_label(worker_id)
    kinds = kind_names(kinds)
    limit = checked_limit(limit)
    postgres = connection.vendor == "postgresql"
    lease, _ = lease_times(now, lease_seconds, connection.vendor)
    now = now or timezone.now()
    limits = registry.concurrency_limits()
    if kinds is not None:
        limits = {k: v for k, v in limits.items() if k in kinds}
    if limit < 1 or kinds == []:
        return []
    actor = Actor.worker(worker_id)
    if postgres and not limits and not claim_writes(actor, now):
        # One statement, autocommitted: nothing else belongs in its transaction.
        picked, params = ready_sql(kinds, limit, now, postgres, cancel_free=start)
        jobs = _reserve(picked, params, worker_id, actor, now, lease, postgres, start)
        for job in jobs:
            announce(
                job.pk,
                Status.QUEUED,
                Status.PROCESSING,
                "claim",
                actor,
                now=now,
                committed=not connection.in_atomic_block,
            )
        return jobs
    with transaction.atomic():
        # A queued job with a cancel request is left to begin(), which cancels
        # it unstarted (or begins the recovery run of a workflow's undos):
        # never run by a start=True claim.
        if limits:
            ids = _within_limits(limits, kinds, limit, now, postgres, cancel_free=start)
            if not ids:
                return []
            picked, params = _ids(ids)
        else:
            picked, params = ready_sql(kinds, limit, now, postgres, cancel_free=start)
        jobs = _reserve(picked, params, worker_id, actor, now, lease, postgres, start)
        if not postgres and jobs:
            JobEvent.objects.bulk_create([_claim_event(job, actor, now, start) for job in jobs])
        for job in jobs:
            announce(job.pk, Status.QUEUED, Status.PROCESSING, "claim", actor, now=now)
    return jobs


def kind_names(kinds: Iterable[str] | None) -> list[str] | None:
    """``kinds`` as a list of kind names, or ``TypeError``: a string's characters
    would be taken as the names (matching nothing), and PostgreSQL refuses to
    compare a kind with a number."""
    if kinds is None:
        return None
    if isinstance(kinds, str | bytes):
        raise TypeError(f"kinds is a list of kind names, not a string: kinds=[{kinds!r}]")
    names = list(kinds)
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:
        raise TypeError(f"kinds is a list of kind names (strings), not of {wrong[0]!r}")
    return [text(name) for name in names]  # a NUL: no kind (PostgreSQL refused it)


def claim_writes(actor: Actor, now: datetime) -> bool:
    """Whether a ``transitioned`` hook function writes for a claim (asked before
    the jobs are known: no job id)."""
    if not hooks.transitioned:
        return False
    change = hooks.Transition(None, Status.QUEUED, Status.PROCESSING, "claim", actor.label, "", now)
    return hooks.transitioned.writes(change)


def _prep(field: str, value: Any, model: Any = Job) -> Any:
    return model._meta.get_field(field).get_db_prep_value(value, connection)


def ready_sql(
    kinds: list[str] | None,
    limit: int,
    now: datetime,
    postgres: bool,
    cancel_free: bool = False,
    skip_kinds: list[str] | None = None,
    columns: str = "id",
) -> tuple[str, list[Any]]:
    """SELECT of the ids of the next ready jobs, in claim order (locked on PostgreSQL).

    The status and the limit are written into the statement, not passed as
    parameters: a prepared claim's generic plan can then use the partial
    index of queued jobs and knows how few rows it needs.

    Jobs of a paused kind (``KindPause``) are left out in the same statement, on
    every worker and machine alike: a ``NOT EXISTS``, which PostgreSQL plans as an
    anti-join probing the (few) active pauses beside the index scan, so the claim
    order still comes from the index and only job rows are locked. (A ``kind <>
    ALL(ARRAY(...))`` of the paused kinds was estimated to leave almost no row,
    and planned as a scan and sort of the whole queue.)
    """
    params: list[Any] = [_prep("run_after", now)]
    where = f"status = '{Status.QUEUED.value}' AND run_after <= %s"
    if cancel_free:
        where += " AND cancel_requested_at IS NULL"
    where += f" AND {kind_not_paused()}"
    for values, negated in ((kinds, False), (skip_kinds, True)):
        if values is None or (negated and not values):
            continue
        if postgres:
            where += f" AND {'NOT ' if negated else ''}kind = ANY(%s)"
            params.append(list(values))
        else:
            where += f" AND kind {'NOT ' if negated else ''}IN ({', '.join(['%s'] * len(values))})"
            params.extend(values)
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    sql = (
        f"SELECT {columns} FROM {Job._meta.db_table} WHERE {where} "
        f"ORDER BY priority DESC, run_after, created_at LIMIT {int(limit)}{lock}"
    )
    return sql, params


def kind_not_paused() -> str:
    """SQL for a WHERE on the Job table: the row's kind has no active pause
    (``KindPause``). Every claim's (``ready_sql``), and ``begin``'s."""
    return (
        f"NOT EXISTS (SELECT 1 FROM {KindPause._meta.db_table} p "
        f"WHERE p.resumed_at IS NULL AND p.kind = {Job._meta.db_table}.kind)"
    )


def _ids(ids: list[Any]) -> tuple[str, list[Any]]:
    placeholders = ", ".join(["%s"] * len(ids))
    return f"SELECT id FROM {Job._meta.db_table} WHERE id IN ({placeholders})", [
        _prep("id", pk) for pk in ids
    ]


def _within_limits(
    limits: dict[str, int],
    kinds: list[str] | None,
    limit: int,
    now: datetime,
    postgres: bool,
    cancel_free: bool,
) -> list[Any]:
    """Ids of candidates that fit their kind's concurrency limit, in claim order.

    Candidates of kinds that are full are skipped; up to four times ``limit``
    are looked at (and locked until the claim commits) so that one full kind
    does not starve the others.
    """
    _lock_kinds(sorted(limits))
    running = dict(
        Job.objects.filter(status=Status.PROCESSING, kind__in=list(limits))
        .values("kind")
        .annotate(n=Count("id"))
        .values_list("kind", "n")
    )
    room = {k: limit_ - running.get(k, 0) for k, limit_ in limits.items()}
    # Full kinds are never candidates: no lock taken on them.
    full = [k for k, r in room.items() if r <= 0]
    picked, params = ready_sql(kinds, limit * 4, now, postgres, cancel_free, full, columns="id, kind")
    ids: list[Any] = []
    with connection.cursor() as cursor:
        cursor.execute(picked, params)
        for pk, kind in cursor.fetchall():
            if kind in room:
                if room[kind] <= 0:
                    continue
                room[kind] -= 1
            ids.append(pk)
            if len(ids) == limit:
                break
    return ids


def _reserve(
    picked: str,
    params: list[Any],
    worker_id: str,
    actor: Actor,
    now: datetime,
    lease: datetime | LeaseClock,
    postgres: bool,
    start: bool = False,
) -> list[Job]:
    """Reserve (or, with ``start``, begin) the picked queued jobs under fresh lease
    tokens; on PostgreSQL the same statement writes their claim events."""
    table = Job._meta.db_table
    queued = Status.QUEUED.value
    values = assignment_values(worker_id, now, lease, start)
    if not postgres:
        returning = job_columns(connection.vendor)
        update = (
            f"UPDATE {table} SET {_assignments(False, start, clock=False)} "
            f"WHERE status = '{queued}' AND id IN ({picked}) RETURNING {returning}"
        )
        rows = _statements.fetch(update, [*values, *params])
    else:
        clock = isinstance(lease, LeaseClock)
        ctes, params = claim_ctes(picked, params, values, actor, now, start, clock=clock)
        rows = _statements.fetch(f"WITH {ctes} SELECT * FROM claimed", params)
    jobs = jobs_from_rows(rows)
    jobs.sort(key=lambda j: (-j.priority, j.run_after, j.created_at))
    return jobs


def _assignments(postgres: bool, start: bool, clock: bool) -> str:
    """The SET clause that reserves (or, with ``start``, begins) a job; its
    parameters are ``assignment_values``. ``clock``: the lease and the heartbeat
    from the database's clock (``LeaseClock``, PostgreSQL)."""
    token = "gen_random_uuid()" if postgres else "lower(hex(randomblob(16)))"
    # Reserved, not running: begin() sets started_at and charges the attempt.
    # claimed_watermark: what this attempt runs on; complete() compares it with
    # the input watermark, so an enqueue raising it meanwhile queues a re-run.
    begun = "started_at = %s, attempts = attempts + 1" if start else "started_at = NULL"
    lease, beat = (LeaseClock.LATER, LeaseClock.NOW) if clock else ("%s", "%s")
    return (
        f"status = '{Status.PROCESSING.value}', worker_id = %s, lease_token = {token}, "
        f"lease_expires_at = {lease}, heartbeat_at = {beat}, {begun}, "
        "claimed_watermark = input_watermark, updated_at = %s"
    )


def assignment_values(worker_id: str, now: datetime, lease: datetime | LeaseClock, start: bool) -> list[Any]:
    """The parameters of ``_assignments(clock=isinstance(lease, LeaseClock))``."""
    stamp = _prep("updated_at", now)
    if isinstance(lease, LeaseClock):
        values = [text(worker_id[:200]), *lease.sql()[1]]
    else:
        values = [text(worker_id[:200]), _prep("lease_expires_at", lease), stamp]
    return values + ([stamp, stamp] if start else [stamp])


def claim_ctes(
    picked: str,
    params: list[Any],
    values: list[Any],
    actor: Actor,
    now: datetime,
    start: bool,
    guard: str = "",
    clock: bool = True,
) -> tuple[str, list[Any]]:
    """PostgreSQL: the claim as two common table expressions, ``claimed`` (the
    reserved jobs' rows) and ``claim_events`` (their history rows), for ``WITH``;
    ``values`` are ``assignment_values`` (``clock``: of a ``LeaseClock``),
    ``guard`` an extra condition.

    ``= ANY(ARRAY(...))``: the picked ids are computed once (an InitPlan) and
    looked up by primary key; as ``IN (subquery)`` the planner may scan the
    whole table for the UPDATE. No status re-check: the picked rows are locked
    as queued (here, or by ``_within_limits`` in this transaction), and a
    re-check would let a plan scan the whole queue through the partial index of
    queued jobs to find them.
    """
    queued, processing = Status.QUEUED.value, Status.PROCESSING.value
    sql = (
        f"claimed AS (UPDATE {Job._meta.db_table} SET {_assignments(True, start, clock)} "
        f"WHERE id = ANY(ARRAY({picked})){guard} RETURNING {job_columns('postgresql')}), "
        f"claim_events AS (INSERT INTO {JobEvent._meta.db_table} (job_id, from_status, to_status, "
        f"transition, actor_label, reason, metadata, created_at) SELECT id, '{queued}', '{processing}', "
        f"'claim', %s::varchar, '', jsonb_build_object('attempt', attempts{'' if start else ' + 1'}), "
        "%s::timestamptz FROM claimed)"
    )
    return sql, [*values, *params, text(actor.label[:200]), _prep("created_at", now, JobEvent)]


def _claim_event(job: Job, actor: Actor, now: datetime, start: bool = False) -> JobEvent:
    return JobEvent(
        job_id=job.pk,
        from_status=Status.QUEUED,
        to_status=Status.PROCESSING,
        transition="claim",
        actor_label=text(actor.label[:200]),
        metadata={"attempt": job.attempts if start else job.attempts + 1},
        created_at=now,
    )


def room_for(kind: str) -> int | None:
    """In the caller's transaction: lock ``kind``'s claims (as a claim does) and
    return how many more of it may run, or None if it has no concurrency limit."""
    limit = registry.concurrency_limits().get(kind)
    if limit is None:
        return None
    _lock_kinds([kind])
    return limit - Job.objects.filter(status=Status.PROCESSING, kind=kind).count()


def _lock_kinds(kinds: list[str]) -> None:
    if connection.vendor != "postgresql":
        return  # SQLite: the IMMEDIATE transaction already holds the write lock.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtext('jobstate:' || k)) "
            "FROM unnest(%s::text[]) AS k ORDER BY k",
            [kinds],
        )
