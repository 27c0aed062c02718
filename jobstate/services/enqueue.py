"""Creating jobs: validated, idempotent by (kind, owner, key), with their first event."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Field, Model
from django.db.models.base import ModelState
from django.utils import timezone

from jobstate import conf
from jobstate.exceptions import DuplicateActiveKey
from jobstate.ids import new_id
from jobstate.models import Job, JobEvent
from jobstate.registry import HandlerSpec, get_handler
from jobstate.services._rows import announce, column, concrete_field, insert_events, notify
from jobstate.services._rows import create_job as _create
from jobstate.services.actors import Actor
from jobstate.states import ACTIVE, Status
from jobstate.storable import clean_key, json_text, text

SMALLINT = (-32768, 32767)
# Lookups-then-inserts of a keyed job before giving up: each retry follows an
# active job that took the key and ended between our lookup and our insert.
KEY_ATTEMPTS = 3


def _clean(
    kind: str,
    parameters: Any,
    *,
    key: str | None,
    watermark: int | None,
    priority: int,
    run_after: datetime | None,
    max_attempts: int | None,
) -> tuple[HandlerSpec, dict[str, Any]]:
    if not isinstance(kind, str) or not kind:
        raise ValidationError({"kind": ["A job kind is required."]})
    spec = get_handler(kind)
    cleaned = spec.validate(parameters)
    size = len(json_text(cleaned, "parameters").encode())
    if size > conf.get("MAX_PARAMETERS_BYTES"):
        raise ValidationError(
            {"parameters": [f"Parameters are {size} bytes; the limit is {conf.get('MAX_PARAMETERS_BYTES')}."]}
        )
    errors: dict[str, list[str]] = {}
    if key is not None and (problem := key_problem(key)) is not None:
        errors["key"] = [problem]
    if watermark is not None and (isinstance(watermark, bool) or not isinstance(watermark, int)):
        errors["watermark"] = ["A watermark is an integer."]
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not SMALLINT[0] <= priority <= SMALLINT[1]
    ):
        errors["priority"] = [f"Priority is an integer between {SMALLINT[0]} and {SMALLINT[1]}."]
    if run_after is not None and not settings.USE_TZ and not connection.features.supports_timezones:
        # Django would raise ValueError at the INSERT (an aware one; a naive one is refused below).
        errors["run_after"] = [
            "run_after cannot be stored with USE_TZ = False: jobstate needs a timezone-aware run_after, "
            f"which Django stores in {connection.display_name} only with USE_TZ = True. Set USE_TZ = True "
            "(Django's default) to defer jobs, or enqueue without run_after."
        ]
    elif run_after is not None and (not isinstance(run_after, datetime) or timezone.is_naive(run_after)):
        errors["run_after"] = ["run_after is a timezone-aware datetime."]
    elif run_after is not None and not _storable_time(run_after):
        # In UTC, as both databases store it: year 10000 is written by PostgreSQL
        # and then cannot be read back; SQLite's conversion overflows.
        errors["run_after"] = ["run_after is between the years 1 and 9999 in UTC."]
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= conf.MAX_ATTEMPTS_LIMIT
    ):
        errors["max_attempts"] = [f"max_attempts is an integer between 1 and {conf.MAX_ATTEMPTS_LIMIT}."]
    if errors:
        raise ValidationError(errors)
    return spec, cleaned


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be an idempotency key (None: it can), the one rule of every
    entry point. A blank key is refused, not stripped: stripping would make keys
    that differ only in spaces share one job, and "  " is no key anyone meant."""
    if not isinstance(key, str) or not key or len(key) > 255:
        return "A key is a non-empty string of at most 255 characters."
    if not key.strip():
        return "A key cannot be blank (only whitespace)."
    if text(key) != key:
        return "A key holds no NUL character or lone surrogate."
    return None


def check_job(
    kind: str,
    parameters: Any = None,
    *,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
) -> dict[str, Any]:
    """What ``enqueue`` would check, writing nothing: the cleaned parameters, or
    ``ValidationError`` (``UnknownKind`` for a kind not registered here)."""
    return _clean(
        kind,
        parameters,
        key=None,
        watermark=None,
        priority=priority,
        run_after=run_after,
        max_attempts=max_attempts,
    )[1]


def _storable_time(moment: datetime) -> bool:
    try:
        moment.astimezone(UTC)  # raises past year 9999 or before year 1
    except OverflowError:
        return False
    return True


def get_or_enqueue(
    kind: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    owner: Any = None,
    key: str | None = None,
    watermark: int | None = None,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
    parent: Job | None = None,
    retry_of: Job | None = None,
    actor: Actor | str | Any | None = None,
    reason: str = "",
) -> tuple[Job, bool]:
    """Queue a job, or return the one its key already names.

    Keys are scoped per owner (system jobs, with no owner, share one scope). A key is
    taken as given; one that is empty, only whitespace, longer than 255 characters or
    holds a NUL is a ``ValidationError`` (``key_problem``).
    With a key: an active job with that (kind, owner, key) is returned, its
    watermark raised (never lowered). Otherwise, when the last completed job
    with that key has processed input at least as new as ``watermark``, that
    job is returned and nothing runs; else a new job is queued. Retention ends
    that: once it deletes the completed job (``RETENTION_DAYS`` after it
    finished), the same key queues the work again. Returns
    ``(job, created)``. Raises ``DuplicateActiveKey`` (never ``IntegrityError``)
    if the key keeps changing hands under it, or if its active job is being
    cancelled (it would end cancelled with this request's work).

    ``run_after`` is a timezone-aware datetime; with ``USE_TZ = False`` only
    PostgreSQL stores one (a ``ValidationError`` elsewhere).
    """
    spec, cleaned = _clean(
        kind,
        parameters,
        key=key,
        watermark=watermark,
        priority=priority,
        run_after=run_after,
        max_attempts=max_attempts,
    )
    owner = user_of(owner)
    who = Actor.of(actor if actor is not None else owner)
    conflict: IntegrityError | None = None
    with transaction.atomic():
        for _attempt in range(KEY_ATTEMPTS):
            if key is not None:
                existing = _existing_for_key(kind, key, watermark, _owner_id(owner))
                if existing is not None:
                    return existing, False
            try:
                with transaction.atomic():
                    job = _create(
                        spec,
                        cleaned,
                        owner,
                        key,
                        watermark,
                        priority,
                        run_after,
                        max_attempts,
                        parent,
                        retry_of,
                        who,
                        reason,
                    )
                return job, True
            except IntegrityError as exc:
                if key is None:
                    raise
                conflict = exc  # a job took the key after our lookup: look again
    raise DuplicateActiveKey(f"Another active '{kind}' job holds key '{key}'; try again") from conflict


def enqueue(kind: str, parameters: Mapping[str, Any] | None = None, **options: Any) -> Job:
    """Queue a job (see ``get_or_enqueue``) and return it."""
    return get_or_enqueue(kind, parameters, **options)[0]


def user_of(owner: Any) -> Any:
    """The owner as a user: None, a user, or the primary key of one (checked: a value of
    another type, out of range or naming no user is a ValidationError, not a database
    error at the insert or at the commit)."""
    if owner is None or isinstance(owner, Model):
        return owner
    User = get_user_model()
    try:
        if isinstance(owner, bool) or not isinstance(owner, int | str | uuid.UUID):
            raise ValidationError("not a key")  # 1.5 would be read as 1
        user = User._default_manager.filter(pk=clean_key(User._meta.pk, owner)).first()
    except ValidationError:
        user = None
    if user is None:
        raise ValidationError({"owner": [f"No user with the id {str(owner)[:100]!r}."]})
    return user


def _owner_id(owner: Any) -> Any:
    return owner.pk if isinstance(owner, Model) else owner


def _existing_for_key(kind: str, key: str, watermark: int | None, owner_id: Any) -> Job | None:
    same_key = Job.objects.filter(kind=kind, key=key, owner_id=owner_id)  # owner_id=None: IS NULL
    active = same_key.select_for_update().filter(status__in=ACTIVE).first()
    if active is not None:
        if active.cancel_requested_at is not None:
            # It ends cancelled: answering with it (or raising its watermark) would
            # drop this request's work without a word.
            raise DuplicateActiveKey(
                f"The active '{kind}' job holding key '{key}' is being cancelled; try again once it has ended"
            )
        if watermark is not None and (active.input_watermark is None or active.input_watermark < watermark):
            Job.objects.filter(pk=active.pk).update(input_watermark=watermark)
            active.input_watermark = watermark
        return active
    last = same_key.filter(status=Status.COMPLETED).order_by("-finished_at").first()
    if last is None:
        return None
    dirty = watermark is not None and (
        last.last_success_watermark is None or watermark > last.last_success_watermark
    )
    return None if dirty else last


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
        spec, cleaned = _clean(
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
    """A child job for ``enqueue_children``: what ``enqueue`` takes for one, keyless."""

    kind: str
    parameters: Mapping[str, Any] | None = None
    priority: int = 0
    run_after: datetime | None = None
    max_attempts: int | None = None
    retry_of: Job | None = None
    reason: str = ""


def enqueue_children(parent: Job, children: Sequence[Child], *, actor: Actor) -> list[Job]:
    """Queue ``parent``'s children (its owner's) in the caller's transaction, in
    order: each validated as ``enqueue`` validates it (nothing is written unless all
    are valid), the jobs and their enqueue events (reason, ``retry_of`` metadata)
    inserted in bulk, the hooks called as ``enqueue`` calls them. A fan-out of
    10,000 children costs a few statements per thousand instead of two each.

    Child ``i`` is created ``i`` microseconds after the first (both databases keep
    microseconds): the claim order (priority, ``run_after``, ``created_at``) then
    follows the spawn order among children of equal priority and ``run_after``, as
    when each had its own insert; one shared instant left them tied."""
    now = timezone.now()
    default_attempts = conf.get("DEFAULT_MAX_ATTEMPTS")
    jobs: list[Job] = []
    for i, child in enumerate(children):
        spec, cleaned = _clean(
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
