"""Internal helpers shared by the service modules: history rows, hook calls, job rows.

Not public API: outside ``jobstate.services`` call the public functions instead.
Every helper here runs inside its caller's transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Field, Model
from django.utils import timezone

from jobstate import conf, hooks
from jobstate.models import Job, JobEvent
from jobstate.registry import HandlerSpec
from jobstate.services.actors import Actor
from jobstate.signals import job_transitioned
from jobstate.states import Status

JobRef = Job | UUID | str


# Concrete fields of jobstate's own models, for hand-written SQL: the stubs type get_field()'s
# result as possibly a reverse relation, and a field's column as unset (before class creation).
def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    return cast("Field[Any, Any]", model._meta.get_field(name))


def column(field: Field[Any, Any]) -> str:
    return cast(str, field.column)


def get_job(job: JobRef) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


class Col:
    """A value of ``update_job``: copy another column of the same row
    (``last_success_watermark = claimed_watermark``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Col) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("Col", self.name))


class Event(NamedTuple):
    """The history row written with a job update (``update_job(event=...)``)."""

    from_status: str
    to_status: str
    name: str
    actor: Actor
    reason: str = ""
    metadata: dict[str, Any] | None = None
    now: datetime | None = None


def update_job(
    pk: Any,
    values: dict[str, Any],
    *,
    status: str,
    token: UUID | str | None = None,
    untroubled: tuple[str, ...] = (),
    event: Event | None = None,
) -> int:
    """Write ``values`` (plain values or ``Col``, no expressions) to the job if it
    is in ``status`` (and held under ``token``, and for each of ``untroubled``
    ("cancel", "stop") none requested); returns the rows written, 0 or 1. With
    ``event``, its history row is inserted when the row was written: on
    PostgreSQL in the same statement (``WITH moved AS (UPDATE ...) INSERT``), so
    the two are atomic even in autocommit. Calls no hook (see ``announce``).

    The guarded writes every job makes while it runs and ends (progress,
    heartbeat, its outcome): one plain statement built once per shape, instead
    of the ORM building the same query on every call (measured: 0.18 instead
    of 0.43 ms of CPU for a progress write).
    """
    shape = tuple((name, v.name if isinstance(v, Col) else None) for name, v in values.items())
    sql = _update_sql(connection.vendor, shape, token is not None, untroubled, event is not None)
    params = [_prep(name, v) for name, v in values.items() if not isinstance(v, Col)]
    params += [_ID.get_db_prep_value(pk, connection), str(status)]
    if token is not None:
        params.append(_TOKEN.get_db_prep_value(token, connection))
    with connection.cursor() as cursor:
        if event is None:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
        values_of_event = _event_values(*event[:6], event.now or timezone.now())
        if connection.vendor == "postgresql":
            cursor.execute(sql, [*params, *values_of_event])
            return int(cursor.rowcount)
        cursor.execute(sql, params)
        written = int(cursor.rowcount)
        if written:
            cursor.execute(
                _event_sql(connection.vendor), [_ID.get_db_prep_value(pk, connection), *values_of_event]
            )
        return written


def _prep(name: str, value: Any) -> Any:
    return concrete_field(Job, name).get_db_prep_save(value, connection)


_ID, _TOKEN = concrete_field(Job, "id"), concrete_field(Job, "lease_token")


@functools.lru_cache(maxsize=256)
def _update_sql(
    vendor: str,
    shape: tuple[tuple[str, str | None], ...],
    token: bool,
    untroubled: tuple[str, ...],
    event: bool,
) -> str:
    qn = connection.ops.quote_name

    def col(name: str) -> str:
        return qn(column(concrete_field(Job, name)))

    sets = ", ".join(f"{col(name)} = {col(source) if source else '%s'}" for name, source in shape)
    where = f"{qn('id')} = %s AND {qn('status')} = %s"
    if token:
        where += f" AND {qn('lease_token')} = %s"
    where += "".join(f" AND {qn(f'{what}_requested_at')} IS NULL" for what in untroubled)
    update = f"UPDATE {qn(Job._meta.db_table)} SET {sets} WHERE {where}"
    if not event or vendor != "postgresql":
        return update
    columns = ", ".join(qn(column(concrete_field(JobEvent, c))) for c in _EVENT_COLUMNS)
    placeholders = ", ".join(["%s"] * (len(_EVENT_COLUMNS) - 1))
    return (
        f"WITH moved AS ({update} RETURNING {qn('id')}) "
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({columns}) SELECT {qn('id')}, {placeholders} FROM moved"
    )


def record_event(
    job_id: Any,
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str = "",
    metadata: dict[str, Any] | None = None,
    now: datetime | None = None,
    *,
    announced: bool = True,
) -> None:
    """One history row of a job, and (unless not ``announced``) its
    ``transitioned`` hooks. One plain INSERT: no model instance is built."""
    now = now or timezone.now()
    params = [
        Job._meta.pk.get_db_prep_value(job_id, connection),
        *_event_values(from_status, to_status, name, actor, reason, metadata, now),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_event_sql(connection.vendor), params)
    if announced:
        announce(job_id, from_status, to_status, name, actor, reason, now)


_EVENT_COLUMNS = (
    "job",
    "from_status",
    "to_status",
    "transition",
    "actor",
    "actor_label",
    "reason",
    "metadata",
    "created_at",
)


def _event_values(
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str,
    metadata: dict[str, Any] | None,
    now: datetime,
) -> list[Any]:
    """A history row's values for ``_EVENT_COLUMNS`` after ``job``, prepared for the database."""
    event = JobEvent._meta
    return [
        from_status,
        str(to_status),
        name,
        event.get_field("actor").get_db_prep_save(actor.user_id, connection),
        actor.label[:200],
        reason or "",
        event.get_field("metadata").get_db_prep_save(metadata or {}, connection),
        event.get_field("created_at").get_db_prep_save(now, connection),
    ]


@functools.lru_cache(maxsize=4)
def _event_sql(vendor: str) -> str:
    q = connection.ops.quote_name
    columns = ", ".join(q(column(concrete_field(JobEvent, c))) for c in _EVENT_COLUMNS)
    values = ", ".join(["%s"] * len(_EVENT_COLUMNS))
    return f"INSERT INTO {q(JobEvent._meta.db_table)} ({columns}) VALUES ({values})"


def record_events(
    job_ids: Sequence[Any],
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str,
    metadata: dict[str, Any],
    now: datetime,
) -> None:
    """The same history row for many jobs, with their hooks."""
    insert_events(job_ids, from_status, to_status, name, actor, reason, metadata, now)
    for job_id in job_ids:
        announce(job_id, from_status, to_status, name, actor, reason, now)


def insert_events(
    job_ids: Sequence[Any],
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str,
    metadata: dict[str, Any],
    now: datetime,
    batch_size: int = 1000,
) -> None:
    """The same history row for many jobs, built by the database (``INSERT ...
    SELECT`` over the job ids: a third of the time of building the JobEvent objects).
    Calls no hook: see ``record_events``."""
    event, job = JobEvent._meta, Job._meta
    q = connection.ops.quote_name
    insert = ", ".join(q(column(concrete_field(JobEvent, c))) for c in _EVENT_COLUMNS)
    fixed = _event_values(from_status, to_status, name, actor, reason, metadata, now)
    pk = job.pk
    with connection.cursor() as cursor:
        for start in range(0, len(job_ids), batch_size):
            chunk = [pk.get_db_prep_value(i, connection) for i in job_ids[start : start + batch_size]]
            cursor.execute(
                f"INSERT INTO {q(event.db_table)} ({insert}) "
                f"SELECT {q(column(pk))}, {', '.join(['%s'] * len(fixed))} FROM {q(job.db_table)} "
                f"WHERE {q(column(pk))} IN ({', '.join(['%s'] * len(chunk))})",
                [*fixed, *chunk],
            )


def announce(
    job_id: Any,
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str = "",
    now: datetime | None = None,
    *,
    committed: bool = False,
) -> None:
    """Call the ``transitioned`` hooks now (inside the transaction), and send
    ``job_transitioned`` once the surrounding transaction commits. ``committed``:
    the change was one autocommitted statement, which no hook function writes
    for (``hooks.transitioned.writes``): they observe it."""
    if hooks.transitioned:
        change = hooks.Transition(job_id, from_status, to_status, name, actor.label, reason or "", now)
        if committed:
            hooks.transitioned.observe(change)
        else:
            hooks.transitioned(change)
    if not job_transitioned.has_listeners(Job):
        return

    def send() -> None:
        job_transitioned.send(
            sender=Job,
            job_id=job_id,
            from_status=from_status,
            to_status=to_status,
            transition=name,
            actor_label=actor.label,
            reason=reason,
        )

    transaction.on_commit(send)


def notify(kinds: Iterable[str]) -> None:
    """Wake idle PostgreSQL workers (delivered when the transaction commits)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for kind in sorted(set(kinds)):
            cursor.execute("SELECT pg_notify('jobstate', %s)", [kind])


def create_job(
    spec: HandlerSpec,
    cleaned: dict[str, Any],
    owner: Any,
    key: str | None,
    watermark: int | None,
    priority: int,
    run_after: datetime | None,
    max_attempts: int | None,
    parent: Job | None,
    retry_of: Job | None,
    actor: Actor,
    reason: str,
) -> Job:
    """Insert one validated job and its "enqueue" event; ``owner`` is a user, a
    user id or None."""
    now = timezone.now()
    job = Job.objects.create(
        kind=spec.name,
        **({"owner": owner} if owner is None or isinstance(owner, Model) else {"owner_id": owner}),
        key=key,
        input_watermark=watermark,
        parameters=cleaned,
        priority=priority,
        run_after=run_after or now,
        max_attempts=max_attempts or spec.max_attempts or conf.get("DEFAULT_MAX_ATTEMPTS"),
        parent=parent,
        retry_of=retry_of,
        created_at=now,
    )
    JobEvent.objects.create(
        job=job,
        from_status="",
        to_status=Status.QUEUED,
        transition="enqueue",
        actor_id=actor.user_id,
        actor_label=actor.label,
        reason=reason,
        metadata={"retry_of": str(retry_of.pk)} if retry_of is not None else {},
        created_at=now,
    )
    announce(job.pk, "", Status.QUEUED, "enqueue", actor, reason)
    notify([spec.name])
    return job
