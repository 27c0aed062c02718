"""Internal helpers shared by the service modules: history rows, hook calls, job rows.

Not public API: outside ``jobstate.services`` call the public functions instead.
Every helper here runs inside its caller's transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Field, Model
from django.utils import timezone

from jobstate import conf, hooks
from jobstate.models import Job, JobEvent
from jobstate.registry import HandlerSpec
from jobstate.services import _statements
from jobstate.services.actors import Actor
from jobstate.signals import job_transitioned
from jobstate.states import Status
from jobstate.storable import text

JobRef = Job | UUID | str


# Concrete fields of jobstate's own models, for hand-written SQL: the stubs type get_field()'s
# result as possibly a reverse relation, and a field's column as unset (before class creation).
def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    return cast("Field[Any, Any]", model._meta.get_field(name))


def column(field: Field[Any, Any]) -> str:
    return cast(str, field.column)


def get_job(job: JobRef) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


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
        *event_values(from_status, to_status, name, actor, reason, metadata, now),
    ]
    _statements.execute(event_sql(connection.vendor), params)
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


def event_values(
    from_status: str,
    to_status: str,
    name: str,
    actor: Actor,
    reason: str,
    metadata: dict[str, Any] | None,
    now: datetime,
) -> list[Any]:
    """A history row's values for ``_EVENT_COLUMNS`` after ``job``, prepared for the database."""
    conn = _statements.current()
    return [
        from_status,
        str(to_status),
        name,
        None if actor.user_id is None else _ACTOR.get_db_prep_save(actor.user_id, conn),
        text(actor.label[:200]),
        text(reason or ""),  # as both databases store it (a NUL, say, from a command's --reason)
        _METADATA.get_db_prep_save(metadata or {}, conn),
        _CREATED.get_db_prep_save(now, conn),
    ]


_ACTOR, _METADATA, _CREATED = (concrete_field(JobEvent, n) for n in ("actor", "metadata", "created_at"))


# The types of a history row's values after ``job`` (PostgreSQL: a parameter in
# a SELECT list has no column to take its type from).
def event_casts() -> str:
    """Placeholders with their types (the actor's is its user model's key type)."""
    actor = concrete_field(JobEvent, "actor").db_type(_statements.current())
    return (
        f"%s::varchar, %s::varchar, %s::varchar, %s::{actor}, %s::varchar, %s::text, %s::jsonb, "
        "%s::timestamptz"
    )


def event_columns() -> str:
    q = connection.ops.quote_name
    return ", ".join(q(column(concrete_field(JobEvent, c))) for c in _EVENT_COLUMNS)


@functools.lru_cache(maxsize=4)
def event_sql(vendor: str) -> str:
    values = ", ".join(["%s"] * len(_EVENT_COLUMNS))
    table = connection.ops.quote_name(JobEvent._meta.db_table)
    return f"INSERT INTO {table} ({event_columns()}) VALUES ({values})"


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
    fixed = event_values(from_status, to_status, name, actor, reason, metadata, now)
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
        # Robust: the change is committed, so a receiver's error (logged by Django) must
        # reach neither the caller, which would take it for a failed write, nor the
        # receivers after it.
        job_transitioned.send_robust(
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
        actor_label=text(actor.label[:200]),
        reason=text(reason or ""),
        metadata={"retry_of": str(retry_of.pk)} if retry_of is not None else {},
        created_at=now,
    )
    announce(job.pk, "", Status.QUEUED, "enqueue", actor, reason)
    notify([spec.name])
    return job
