"""Guarded writes of job rows: the statements every job makes while it runs and
ends (claim rows read back, progress, heartbeat, its outcome with its history
row), each built once per shape and run through ``_statements`` (prepared on
PostgreSQL), instead of the ORM building the same query on every call.

Not public API: outside ``jobstate.services`` call the public functions instead.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from jobstate import conf
from jobstate.models import Job, JobEvent
from jobstate.models.job import LeaseClock
from jobstate.services import _statements
from jobstate.services._rows import (
    column,
    concrete_field,
    event_casts,
    event_columns,
    event_sql,
    event_values,
)
from jobstate.services.actors import Actor
from jobstate.storable import text


@functools.lru_cache(maxsize=4)
def job_columns(vendor: str) -> str:
    """Every column of ``jobstate_job`` in model field order (for ``RETURNING``)."""
    qn = connection.ops.quote_name
    return ", ".join(qn(column(f)) for f in Job._meta.concrete_fields)


_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]

# The attribute of Django's connection wrapper (one per thread) that keeps the
# converters of ``jobstate_job`` rows for that connection.
_CONVERTERS = "_jobstate_job_converters"


def _converters(conn: Any) -> list[tuple[int, Any, list[Any]]]:
    """What the ORM's compiler applies to each column of a job row read back: the
    backend's converters, then the field's own (JSON decoded; on SQLite dates
    and UUIDs parsed); only the columns that have some."""
    found = getattr(conn, _CONVERTERS, None)
    if found is None:
        found = []
        table = Job._meta.db_table
        for i, field in enumerate(Job._meta.concrete_fields):
            expression = field.get_col(table)
            convert = conn.ops.get_db_converters(expression) + expression.get_db_converters(conn)
            if convert:
                found.append((i, expression, convert))
        setattr(conn, _CONVERTERS, found)
    return found


def jobs_from_rows(rows: Iterable[Sequence[Any]], conn: Any = None) -> list[Job]:
    """Job instances from rows of ``job_columns()``, converted as the ORM would."""
    conn = conn or _statements.current()
    converters = _converters(conn)
    jobs = []
    for row in rows:
        values = list(row)
        for i, expression, convert in converters:
            for function in convert:
                values[i] = function(values[i], expression, conn)
        jobs.append(Job.from_db(conn.alias, _ATTNAMES, values))
    return jobs


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


# The longest lease a call may ask for (a year): a lease runs out only when its
# worker is lost, and past the year 9999 it could not be stored at all.
MAX_LEASE_SECONDS = 366 * 24 * 3600.0


def checked_lease(lease_seconds: Any) -> float:
    """``lease_seconds`` as a float, or ``ValueError``: 0 or less (a lease already
    run out: the reaper would take the job at once), NaN, infinity or more than a
    year (Python's date arithmetic or PostgreSQL's interval overflowed, in the
    middle of the call), or not a number."""
    if (
        isinstance(lease_seconds, bool)
        or not isinstance(lease_seconds, int | float)
        or not 0 < lease_seconds <= MAX_LEASE_SECONDS  # NaN fails it too
    ):
        raise ValueError(
            f"lease_seconds is a number of seconds greater than 0 and at most {MAX_LEASE_SECONDS:.0f}, "
            f"not {lease_seconds!r}"
        )
    return float(lease_seconds)


# The largest batch a ``limit`` may ask for: PostgreSQL's LIMIT is a bigint and a
# claim looks at up to four times its limit; SQLite took a larger one for a text.
MAX_LIMIT = 2**31 - 1


def checked_limit(limit: Any) -> int:
    """``limit`` (how many rows a call handles at most), or ``TypeError`` for one
    that is not an integer and ``ValueError`` for one below 0 or above
    ``MAX_LIMIT`` (a database error, IntegrityError on SQLite, in the middle of
    the call); 0 handles none."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit is an integer, not {limit!r}")
    if not 0 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit is between 0 and {MAX_LIMIT}, not {limit}")
    return limit


def worker_label(worker_id: Any) -> str:
    """``worker_id`` as both databases store it (at most 200 characters, no NUL:
    PostgreSQL refuses one), or ``TypeError`` for one that is not a string (SQLite
    stored a number as its text, PostgreSQL refused it mid-call)."""
    if not isinstance(worker_id, str):
        raise TypeError(f"worker_id is a string, not {worker_id!r:.100}")
    return text(worker_id[:200])


def checked_now(now: Any) -> datetime | None:
    """The ``now`` a service was given (None: its clock), or ``ValidationError``,
    before anything is written, as ``enqueue`` refuses such a ``run_after``: not a
    datetime, or a naive one with ``USE_TZ = True`` (Django only warned, and stored
    it as if in the default time zone). With ``USE_TZ = False`` a naive one is what
    Django stores."""
    return checked_time(now, "now")


def checked_time(moment: Any, field: str) -> datetime | None:
    """``checked_now`` for any time a service stores, the error keyed by ``field``;
    also refused outside the years 1 to 9999 in UTC (PostgreSQL writes year 10000
    and then cannot read it back; SQLite's conversion overflows)."""
    if moment is None:
        return None
    if not isinstance(moment, datetime):
        raise ValidationError({field: [f"{field} is a datetime."]})
    if settings.USE_TZ and moment.utcoffset() is None:
        raise ValidationError({field: [f"{field} is a timezone-aware datetime."]})
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValidationError({field: [f"{field} is between the years 1 and 9999 in UTC."]}) from None
    return moment


def lease_times(
    now: datetime | None, lease_seconds: float | None = None, vendor: str | None = None
) -> tuple[datetime | LeaseClock, datetime | LeaseClock]:
    """What a lease write stores as ``lease_expires_at`` and ``heartbeat_at``.

    No ``now`` on PostgreSQL: the database's clock, computed by the statement
    (``LeaseClock``), the clock the reaper judges expiry by, so a worker whose own
    clock is off writes leases that run for ``lease_seconds`` all the same. A
    caller's ``now``, or SQLite (one machine): that time, this process's clock.

    ``lease_seconds`` (None: ``LEASE_SECONDS``) is a number greater than 0 and at
    most ``MAX_LEASE_SECONDS``, else ``ValueError``, before anything is written;
    ``now`` as ``checked_now`` takes it."""
    now = checked_now(now)
    seconds = float(conf.get("LEASE_SECONDS")) if lease_seconds is None else checked_lease(lease_seconds)
    if now is None and (vendor or _statements.current().vendor) == "postgresql":
        return LeaseClock(seconds), LeaseClock()
    now = now or timezone.now()
    return now + timedelta(seconds=seconds), now


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
    """Write ``values`` (plain values, ``Col`` or ``LeaseClock``, no other
    expressions) to the job if it
    is in ``status`` (and held under ``token``, and for each of ``untroubled``
    ("cancel", "stop") none requested); returns the rows written, 0 or 1. With
    ``event``, its history row is inserted when the row was written: on
    PostgreSQL in the same statement (``WITH moved AS (UPDATE ...) INSERT``), so
    the two are atomic even in autocommit. Calls no hook (see ``announce``).

    The guarded writes every job makes while it runs and ends (progress,
    heartbeat, its outcome): one plain statement built once per shape and, on
    PostgreSQL, prepared (``_statements``), instead of the ORM building the same
    query on every call.
    """
    conn = _statements.current()
    postgres = conn.vendor == "postgresql"
    sql, params = update_statement(conn, pk, values, status, token, untroubled, event)
    if event is None or postgres:
        return _statements.execute(sql, params, conn)
    written = _statements.execute(sql, params, conn)
    if written:
        row = [_ID.get_db_prep_value(pk, conn), *event_values(*event[:6], event.now or timezone.now())]
        _statements.execute(event_sql(conn.vendor), row, conn)
    return written


def update_statement(
    conn: Any,
    pk: Any,
    values: dict[str, Any],
    status: str,
    token: UUID | str | None = None,
    untroubled: tuple[str, ...] = (),
    event: Event | None = None,
    cte: bool = False,
) -> tuple[str, list[Any]]:
    """``update_job``'s statement and its parameters (on PostgreSQL with the
    history row; elsewhere without it). ``cte`` (PostgreSQL, with ``event``):
    as two common table expressions, ``moved`` (the ids of the rows written)
    and ``moved_event``, for a larger statement."""
    postgres = conn.vendor == "postgresql"
    shape = tuple((name, _source(v, postgres)) for name, v in values.items())
    sql = _update_sql(conn.vendor, shape, token is not None, untroubled, event is not None, cte)
    params: list[Any] = []
    for name, v in values.items():
        if isinstance(v, LeaseClock):
            params += v.sql()[1] if postgres else [prep_job_value(name, v.local(), conn)]
        elif not isinstance(v, Col):
            params.append(prep_job_value(name, v, conn))
    params += [_ID.get_db_prep_value(pk, conn), str(status)]
    if token is not None:
        params.append(_TOKEN.get_db_prep_value(token, conn))
    if event is not None and postgres:
        params += event_values(*event[:6], event.now or timezone.now())
    return sql, params


def _source(value: Any, postgres: bool) -> str | None:
    """Where ``_update_sql`` takes a value from: None, a parameter; ``LeaseClock``'s
    SQL (PostgreSQL); or the name of a column (``Col``)."""
    if isinstance(value, Col):
        return value.name
    if isinstance(value, LeaseClock) and postgres:
        return value.sql()[0]
    return None


# Values psycopg sends as they are (the field's own preparation would return
# them unchanged), for the columns that are not JSON; anything else goes
# through the field.
_AS_IS = (str, int, UUID)


@functools.lru_cache(maxsize=64)
def _plain_column(name: str) -> bool:
    return concrete_field(Job, name).get_internal_type() != "JSONField"


def prep_job_value(name: str, value: Any, conn: Any) -> Any:
    """A value for a ``jobstate_job`` column, prepared for the database."""
    if (
        value is not None
        and not isinstance(value, bool)
        and (isinstance(value, _AS_IS) or (isinstance(value, datetime) and value.tzinfo is not None))
        and conn.vendor == "postgresql"
        and _plain_column(name)
    ):
        return value
    return concrete_field(Job, name).get_db_prep_save(value, conn)


_ID, _TOKEN = concrete_field(Job, "id"), concrete_field(Job, "lease_token")


@functools.lru_cache(maxsize=256)
def _update_sql(
    vendor: str,
    shape: tuple[tuple[str, str | None], ...],
    token: bool,
    untroubled: tuple[str, ...],
    event: bool,
    cte: bool = False,
) -> str:
    qn = connection.ops.quote_name

    def col(name: str) -> str:
        return qn(column(concrete_field(Job, name)))

    def value(source: str | None) -> str:
        if source is None:
            return "%s"
        return source if source in (LeaseClock.NOW, LeaseClock.LATER) else col(source)

    sets = ", ".join(f"{col(name)} = {value(source)}" for name, source in shape)
    where = f"{qn('id')} = %s AND {qn('status')} = %s"
    if token:
        where += f" AND {qn('lease_token')} = %s"
    where += "".join(f" AND {qn(f'{what}_requested_at')} IS NULL" for what in untroubled)
    update = f"UPDATE {qn(Job._meta.db_table)} SET {sets} WHERE {where}"
    if not event or vendor != "postgresql":
        return update
    insert = (
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({event_columns()}) "
        f"SELECT {qn('id')}, {event_casts()} FROM moved"
    )
    if cte:
        return f"moved AS ({update} RETURNING {qn('id')}), moved_event AS ({insert})"
    return f"WITH moved AS ({update} RETURNING {qn('id')}) {insert}"
