"""Creating many jobs at once: ``enqueue_many`` (keyless jobs) and a fan-out's
children (``enqueue_children``), each validated as ``enqueue`` validates one, then
inserted in bulk with their enqueue events in one transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Field
from django.db.models.base import ModelState
from django.utils import timezone

from jobstate import conf
from jobstate.ids import new_id
from jobstate.models import Job, JobEvent
from jobstate.registry import get_handler
from jobstate.services._rows import announce, column, concrete_field, insert_events, notify
from jobstate.services.actors import Actor
from jobstate.services.enqueue import check_job, cleaned_input, user_of
from jobstate.states import Status
from jobstate.storable import text


def enqueue_many(
    items: Iterable[tuple[str, Mapping[str, Any] | None]],
    *,
    owner: Any = None,
    priority: int = 0,
    actor: Actor | str | Any | None = None,
    batch_size: int = 1000,
) -> list[Job]:
    """Queue many keyless jobs at once: all validated first, then bulk inserted
    with their history rows in one transaction (on PostgreSQL one statement per
    ``batch_size`` jobs writes both the jobs and their enqueue events)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("batch_size is a positive integer.")
    now = timezone.now()
    owner = user_of(owner)
    who = Actor.of(actor if actor is not None else owner)
    default_attempts = conf.get("DEFAULT_MAX_ATTEMPTS")
    rows: list[tuple[str, Any, int]] = []
    for kind, parameters in items:
        spec, cleaned = cleaned_input(
            kind, parameters, key=None, watermark=None, priority=priority, run_after=None, max_attempts=None
        )
        rows.append((spec.name, cleaned, spec.max_attempts or default_attempts))
    if not rows:
        return []
    template = Job(
        kind="", owner=owner, parameters={}, priority=priority, run_after=now, created_at=now, updated_at=now
    )
    jobs = [_like(template, id=new_id(), kind=k, parameters=p, max_attempts=m) for k, p, m in rows]
    with transaction.atomic():
        if connection.vendor == "postgresql":
            _insert_with_events(jobs, who, now, batch_size)
        else:
            Job.objects.bulk_create(jobs, batch_size=batch_size)
            ids = [job.pk for job in jobs]
            insert_events(ids, "", Status.QUEUED, "enqueue", who, "", {}, now, batch_size)
        for job in jobs:
            job._state.adding = False
            job._state.db = connection.alias
            announce(job.pk, "", Status.QUEUED, "enqueue", who)
        notify({kind for kind, _p, _m in rows})
    return jobs


@dataclass(frozen=True)
class Child:
    """A child job for ``enqueue_children``: what ``enqueue`` takes for one, keyless.
    ``retry_of`` is a Job or None, else ``TypeError`` (as ``enqueue`` refuses one)."""

    kind: str
    parameters: Mapping[str, Any] | None = None
    priority: int = 0
    run_after: datetime | None = None
    max_attempts: int | None = None
    retry_of: Job | None = None
    reason: str = ""

    # Set by ``checked_child`` only: kind, parameters and options were validated, so
    # ``enqueue_children`` does not validate them again. Not an argument: a child
    # made otherwise (or by ``dataclasses.replace``) is validated there.
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.retry_of is not None and not isinstance(self.retry_of, Job):
            raise TypeError(f"retry_of is a Job or None, not {self.retry_of!r:.100}")

    def retrying(self, retry_of: Job | None, reason: str = "") -> Child:
        """This child with ``retry_of`` and ``reason`` (neither part of what
        ``checked_child`` validates: one it made stays validated)."""
        child = replace(self, retry_of=retry_of, reason=reason)
        object.__setattr__(child, "_checked", self._checked)
        return child


def checked_child(
    kind: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
) -> Child:
    """A ``Child`` validated now as ``enqueue`` validates a job (``ValidationError``,
    ``UnknownKind``), which ``enqueue_children`` then takes without validating it
    again (a workflow's ``spawn``). Its parameters are the cleaned ones, copied: a
    change to the caller's dict afterwards does not reach the child."""
    cleaned = check_job(kind, parameters, priority=priority, run_after=run_after, max_attempts=max_attempts)
    child = Child(kind, cleaned, priority, run_after, max_attempts)
    object.__setattr__(child, "_checked", True)
    return child


def enqueue_children(parent: Job, children: Sequence[Child], *, actor: Actor) -> list[Job]:
    """Queue ``parent``'s children (its owner's) in the caller's transaction, in
    order: each validated as ``enqueue`` validates it, unless ``checked_child`` did
    (nothing is written unless all are valid), the jobs and their enqueue events
    (reason, ``retry_of`` metadata) inserted in bulk, the hooks called as
    ``enqueue`` calls them. A fan-out of 10,000 children costs a few statements
    per thousand instead of two each.

    Child ``i`` is created ``i`` microseconds after the first (both databases keep
    microseconds): the claim order (priority, ``run_after``, ``created_at``) then
    follows the spawn order among children of equal priority and ``run_after``, as
    when each had its own insert; one shared instant left them tied.

    ``parent`` is a Job, else ``TypeError``, nothing written."""
    if not isinstance(parent, Job):
        raise TypeError(f"parent is a Job, not {parent!r:.100}")
    now = timezone.now()
    default_attempts = conf.get("DEFAULT_MAX_ATTEMPTS")
    jobs: list[Job] = []
    for i, child in enumerate(children):
        if child._checked:
            spec, cleaned = get_handler(child.kind), cast(dict[str, Any], child.parameters)
        else:
            spec, cleaned = cleaned_input(
                child.kind,
                child.parameters,
                key=None,
                watermark=None,
                priority=child.priority,
                run_after=child.run_after,
                max_attempts=child.max_attempts,
            )
        jobs.append(
            Job(
                kind=spec.name,
                owner_id=parent.owner_id,
                parameters=cleaned,
                priority=child.priority,
                run_after=child.run_after or now,
                max_attempts=child.max_attempts or spec.max_attempts or default_attempts,
                parent=parent,
                retry_of=child.retry_of,
                created_at=now + timedelta(microseconds=i),
            )
        )
    if not jobs:
        return []
    label = text(actor.label[:200])
    events = [
        JobEvent(
            job=job,
            from_status="",
            to_status=Status.QUEUED,
            transition="enqueue",
            actor_id=actor.user_id,
            actor_label=label,
            reason=text(child.reason),
            metadata={"retry_of": str(child.retry_of.pk)} if child.retry_of is not None else {},
            created_at=job.created_at,
        )
        for job, child in zip(jobs, children, strict=True)
    ]
    with transaction.atomic():
        Job.objects.bulk_create(jobs, batch_size=1000)
        JobEvent.objects.bulk_create(events, batch_size=1000)
        for job, child in zip(jobs, children, strict=True):
            announce(job.pk, "", Status.QUEUED, "enqueue", actor, child.reason)
        notify({job.kind for job in jobs})
    return jobs


def _like(template: Job, **values: Any) -> Job:
    """A copy of an unsaved ``template`` with ``values`` set: Model.__init__ for
    each of 10,000 jobs costs more than inserting them."""
    job = Job.__new__(Job)
    job.__dict__.update(template.__dict__)
    job.__dict__.update(values)
    job._state = ModelState()
    job._state.fields_cache = dict(template._state.fields_cache)
    return job


# What differs between the jobs of one enqueue_many call; every other column holds
# one value for all of them.
_PER_JOB = ("id", "kind", "parameters", "max_attempts")


def _insert_with_events(jobs: list[Job], who: Actor, now: datetime, batch_size: int) -> None:
    """PostgreSQL: per batch, one ``INSERT ... SELECT FROM jsonb_to_recordset(...)``
    of the jobs (only the columns that differ per job travel, as one JSON
    document) whose ``RETURNING`` feeds the insert of their enqueue events."""
    q = connection.ops.quote_name
    fields = Job._meta.concrete_fields
    per_job = {f.attname: f for f in fields if f.attname in _PER_JOB}
    shared = [f for f in fields if f.attname not in _PER_JOB]
    values = [f.get_db_prep_save(getattr(jobs[0], f.attname), connection) for f in shared]
    select = [f"u.{f.attname}" if f.attname in per_job else f"CAST(%s AS {_sql_type(f)})" for f in fields]
    record = ", ".join(f"{name} {_sql_type(per_job[name])}" for name in _PER_JOB)
    event = JobEvent._meta
    columns = ["job", "from_status", "to_status", "transition", "actor", "actor_label", "reason", "metadata"]
    fixed = [
        "",
        Status.QUEUED.value,
        "enqueue",
        who.user_id,
        text(who.label[:200]),
        "",
        event.get_field("metadata").get_db_prep_save({}, connection),
        event.get_field("created_at").get_db_prep_save(now, connection),
    ]
    sql = (
        f"WITH inserted AS (INSERT INTO {q(Job._meta.db_table)} ({', '.join(q(column(f)) for f in fields)}) "
        f"SELECT {', '.join(select)} FROM jsonb_to_recordset(%s::jsonb) AS u({record}) "
        f"RETURNING {q(column(Job._meta.pk))}) "
        f"INSERT INTO {q(event.db_table)} "
        f"({', '.join(q(column(concrete_field(JobEvent, name))) for name in [*columns, 'created_at'])}) "
        f"SELECT {q(column(Job._meta.pk))}, {', '.join(['%s'] * len(fixed))} FROM inserted"
    )
    encoder = Job._meta.get_field("parameters").encoder
    with connection.cursor() as cursor:
        for start in range(0, len(jobs), batch_size):
            document = json.dumps(
                [
                    {
                        "id": str(j.id),
                        "kind": j.kind,
                        "parameters": j.parameters,
                        "max_attempts": j.max_attempts,
                    }
                    for j in jobs[start : start + batch_size]
                ],
                cls=encoder,
            )
            cursor.execute(sql, [*values, document, *fixed])


def _sql_type(field: Field[Any, Any]) -> str:
    """The column's type without its size (``varchar``, not ``varchar(200)``); every
    concrete field of Job has one (the stubs allow None)."""
    return cast(str, field.db_type(connection)).split("(")[0]
