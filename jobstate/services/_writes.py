"""Guarded writes of job rows: the statements every job makes while it runs and
ends (claim rows read back, progress, heartbeat, its outcome with its history
row), each built once per shape and run through ``_statements`` (prepared on
PostgreSQL), instead of the ORM building the same query on every call.

Not public API: outside ``jobstate.services`` call the public functions instead.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.db import connection
from django.utils import timezone

from jobstate.models import Job, JobEvent
from jobstate.services import _statements
from jobstate.services._rows import (
    EVENT_CASTS,
    column,
    concrete_field,
    event_columns,
    event_sql,
    event_values,
)
from jobstate.services.actors import Actor


def job_columns() -> str:
    """Every column of ``jobstate_job`` in model field order (for ``RETURNING``)."""
    qn = connection.ops.quote_name
    return ", ".join(qn(column(f)) for f in Job._meta.concrete_fields)


def jobs_from_rows(rows: Iterable[Sequence[Any]]) -> list[Job]:
    """Job instances from rows of ``job_columns()``, converted as the ORM would
    (JSON decoded, and on SQLite dates and UUIDs parsed)."""
    table = Job._meta.db_table
    converters = []
    for i, field in enumerate(Job._meta.concrete_fields):
        expression = field.get_col(table)
        # What the ORM's compiler applies: the backend's, then the field's own.
        found = connection.ops.get_db_converters(expression) + expression.get_db_converters(connection)
        if found:
            converters.append((i, expression, found))
    jobs = []
    for row in rows:
        values = list(row)
        for i, expression, found in converters:
            for convert in found:
                values[i] = convert(values[i], expression, connection)
        jobs.append(Job.from_db(connection.alias, None, values))
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
    heartbeat, its outcome): one plain statement built once per shape and, on
    PostgreSQL, prepared (``_statements``), instead of the ORM building the same
    query on every call.
    """
    postgres = connection.vendor == "postgresql"
    shape = tuple((name, v.name if isinstance(v, Col) else None) for name, v in values.items())
    sql = _update_sql(connection.vendor, shape, token is not None, untroubled, event is not None)
    params = [prep_job_value(name, v, postgres) for name, v in values.items() if not isinstance(v, Col)]
    params += [_ID.get_db_prep_value(pk, connection), str(status)]
    if token is not None:
        params.append(_TOKEN.get_db_prep_value(token, connection))
    if event is None:
        return _statements.execute(sql, params)
    values_of_event = event_values(*event[:6], event.now or timezone.now())
    if postgres:
        return _statements.execute(sql, [*params, *values_of_event])
    written = _statements.execute(sql, params)
    if written:
        _statements.execute(
            event_sql(connection.vendor), [_ID.get_db_prep_value(pk, connection), *values_of_event]
        )
    return written


# Values psycopg sends as they are (the field's own preparation would return
# them unchanged), for the columns that are not JSON; anything else goes
# through the field.
_AS_IS = (str, int, UUID)


@functools.lru_cache(maxsize=64)
def _plain_column(name: str) -> bool:
    return concrete_field(Job, name).get_internal_type() != "JSONField"


def prep_job_value(name: str, value: Any, postgres: bool) -> Any:
    """A value for a ``jobstate_job`` column, prepared for the database."""
    if (
        postgres
        and value is not None
        and not isinstance(value, bool)
        and (isinstance(value, _AS_IS) or (isinstance(value, datetime) and value.tzinfo is not None))
        and _plain_column(name)
    ):
        return value
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
    return (
        f"WITH moved AS ({update} RETURNING {qn('id')}) "
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({event_columns()}) "
        f"SELECT {qn('id')}, {EVENT_CASTS} FROM moved"
    )
