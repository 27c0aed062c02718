"""What retention (``jobstate.worker.retention``) keeps for work still under way.

An active retry holds every job earlier in its retry chain (A retried as B, B as C:
C running holds B and A), and everything below those jobs: their children, whose
children, and so on (a workflow retried with ``retry_from`` reads the old job's
children through its copied steps, and a retried fan-out reuses the completed
children of the earlier run's child workflows, ``jobstate.workflows.reuse``, one
level down and further). Deleted, a job in the chain would leave the next one's
``retry_of`` empty (``on_delete=SET_NULL``) while the chain still runs.

An active job keeps every job below it (``ActiveAbove``, ``active_ancestors``): a child
workflow of its that failed, retried by an operator, reuses its own completed children.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, F, Func, Q
from django.db.models.expressions import RawSQL
from django.db.models.sql.compiler import SQLCompiler

from jobstate.models import Job
from jobstate.states import ACTIVE

_pk = Job._meta.get_field("id")


def held_cte() -> tuple[str, list[str]]:
    """``held(id)``, a recursive common table expression: every job earlier in the
    retry chain of an active job (its ``retry_of``, that job's ``retry_of``, and so
    on back). Read once a query: from the active retries (the status and
    ``retry_of`` partial indexes), then up each chain by primary key."""
    table = connection.ops.quote_name(Job._meta.db_table)
    active = ", ".join(["%s"] * len(ACTIVE))
    return (
        f"held(id) AS (SELECT retry_of_id FROM {table} WHERE retry_of_id IS NOT NULL AND status IN ({active})"
        f" UNION SELECT j.retry_of_id FROM {table} j JOIN held ON j.id = held.id"
        f" WHERE j.retry_of_id IS NOT NULL)",
        [str(s) for s in ACTIVE],
    )


def held() -> Q:
    """The jobs an active retry holds: those earlier in its retry chain (deleted, the
    next one's ``retry_of`` is emptied under the running chain), and every job below
    them (a workflow retried with ``retry_from`` reads the old job's children, its
    copied steps naming them; a retried fan-out reuses the completed children of the
    old job's child workflows)."""
    cte, params = held_cte()
    table = connection.ops.quote_name(Job._meta.db_table)
    ids = RawSQL(
        f"WITH RECURSIVE {cte}, below(id) AS (SELECT id FROM held"
        f" UNION SELECT j.id FROM {table} j JOIN below ON j.parent_id = below.id)"
        f" SELECT id FROM below",
        params,
    )
    return Q(pk__in=ids)


class ActiveAbove(Func):
    """True for a job with an active job above it: its parent, or that one's parent,
    and so on up (looked up from the job: its ancestors, by primary key)."""

    output_field = BooleanField()

    def __init__(self) -> None:
        super().__init__(F("parent_id"))

    def as_sql(  # type: ignore[override]
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> tuple[str, list[Any]]:
        parent, params = compiler.compile(self.get_source_expressions()[0])
        table = connection.ops.quote_name(Job._meta.db_table)
        active = ", ".join(["%s"] * len(ACTIVE))
        # Most jobs have no parent: the test first spares them the subquery (on
        # 50,000 such jobs, half the time on PostgreSQL, a fifth on SQLite).
        sql = (
            f"({parent} IS NOT NULL AND EXISTS (WITH RECURSIVE above(id) AS (SELECT {parent}"
            f" UNION SELECT j.parent_id FROM {table} j JOIN above ON j.id = above.id"
            f" WHERE j.parent_id IS NOT NULL)"
            f" SELECT 1 FROM above JOIN {table} a ON a.id = above.id WHERE a.status IN ({active})))"
        )
        return sql, [*params, *params, *(str(s) for s in ACTIVE)]


def active_ancestors(pks: list[Any], using: str) -> list[tuple[Any, Job]]:
    """Those of ``pks`` with an active job above them (``ActiveAbove``), each paired
    with the nearest such job (its id, kind and status: no query of its own). One
    statement: up each job's ``parent`` chain by primary key."""
    if not pks:
        return []
    conn = connections[using]
    table = conn.ops.quote_name(Job._meta.db_table)
    some = ", ".join(["%s"] * len(pks))
    active = ", ".join(["%s"] * len(ACTIVE))
    with conn.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE up(job, id, depth) AS ("
            f"SELECT id, parent_id, 1 FROM {table} WHERE id IN ({some}) AND parent_id IS NOT NULL"
            f" UNION SELECT up.job, j.parent_id, up.depth + 1 FROM {table} j JOIN up ON j.id = up.id"
            f" WHERE j.parent_id IS NOT NULL"
            f") SELECT up.job, a.id, a.kind, a.status, up.depth FROM up JOIN {table} a ON a.id = up.id"
            f" WHERE a.status IN ({active})",
            [*(_pk.get_db_prep_value(pk, conn) for pk in pks), *(str(s) for s in ACTIVE)],
        )
        rows = cursor.fetchall()
    nearest: dict[Any, tuple[int, Job]] = {}
    for job, pk, kind, status, depth in rows:
        key = _pk.to_python(job)
        if key not in nearest or depth < nearest[key][0]:
            nearest[key] = (depth, Job(id=_pk.to_python(pk), kind=kind, status=status))
    return sorted(((key, above) for key, (_, above) in nearest.items()), key=lambda pair: str(pair[0]))


def chains_locked(pks: list[Any]) -> list[Any]:
    """Those of ``pks`` (locked) whose retry chain from them on, and each of their
    ancestors' from it on, this transaction could lock (``FOR UPDATE SKIP LOCKED``): a
    retry being made of any of those jobs holds its row, and would hold the job (an
    ancestor's retry holds what is below it, ``held``)."""
    if not pks:
        return []
    table = connection.ops.quote_name(Job._meta.db_table)
    some = ", ".join(["%s"] * len(pks))
    ids = [_pk.get_db_prep_value(pk, connection) for pk in pks]
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE up(job, id) AS ("
            f"SELECT id, parent_id FROM {table} WHERE id IN ({some}) AND parent_id IS NOT NULL"
            f" UNION SELECT up.job, j.parent_id FROM {table} j JOIN up ON j.id = up.id"
            f" WHERE j.parent_id IS NOT NULL"
            f"), later(job, id) AS (SELECT job, id FROM up"
            f" UNION SELECT j.retry_of_id, j.id FROM {table} j WHERE j.retry_of_id IN ({some})"
            f" UNION SELECT later.job, j.id FROM {table} j JOIN later ON j.retry_of_id = later.id"
            f") SELECT job, id FROM later",
            [*ids, *ids],
        )
        pairs = cursor.fetchall()
    wanted = {i for _job, i in pairs} - set(pks)
    got = set(
        Job.objects.filter(pk__in=wanted).select_for_update(skip_locked=True).values_list("pk", flat=True)
    )
    mine = set(pks)
    missed = {job for job, i in pairs if i not in got and i not in mine}
    return [pk for pk in pks if pk not in missed]


# Job ids per statement in ``holding_retries``.
CHUNK = 1000


def holding_retries(roots: list[Any], below: list[Any], using: str) -> list[tuple[Any, Job]]:
    """The jobs a delete of ``roots`` would take (``roots`` and ``below``, the jobs
    under them) that an active retry holds (``held``), each paired with that retry
    (its id, kind and status: no query of its own): one later in the job's retry
    chain, or in the chain of a job above a root (everything below a held job is
    held; one below another of them needs no reason of its own). Read forward along
    ``retry_of`` from those jobs (its partial index), ``CHUNK`` of them a statement,
    the roots' ancestors in the first."""
    conn = connections[using]
    table = conn.ops.quote_name(Job._meta.db_table)
    active = ", ".join(["%s"] * len(ACTIVE))
    ids = [_pk.get_db_prep_value(pk, conn) for pk in [*roots, *below]]
    top = [_pk.get_db_prep_value(pk, conn) for pk in roots]
    found: set[tuple[Any, Any, str, str]] = set()
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        some = ", ".join(["%s"] * len(chunk))
        up, up_params, up_rows = "", [], ""
        if start == 0 and top:
            up = (
                f"up(id, job) AS (SELECT parent_id, id FROM {table}"
                f" WHERE id IN ({', '.join(['%s'] * len(top))}) AND parent_id IS NOT NULL"
                f" UNION SELECT j.parent_id, up.job FROM {table} j JOIN up ON j.id = up.id"
                f" WHERE j.parent_id IS NOT NULL), "
            )
            up_params, up_rows = top, " UNION ALL SELECT id, job FROM up"
        with conn.cursor() as cursor:
            cursor.execute(
                f"WITH RECURSIVE {up}start(id, job) AS (SELECT id, id FROM {table} WHERE id IN ({some})"
                f"{up_rows}), later(job, id, kind, status) AS ("
                f"SELECT start.job, j.id, j.kind, j.status FROM {table} j JOIN start"
                f" ON j.retry_of_id = start.id WHERE j.retry_of_id IS NOT NULL"
                f" UNION SELECT later.job, j.id, j.kind, j.status FROM {table} j JOIN later"
                f" ON j.retry_of_id = later.id WHERE j.retry_of_id IS NOT NULL"
                f") SELECT job, id, kind, status FROM later WHERE status IN ({active})",
                [*up_params, *chunk, *(str(s) for s in ACTIVE)],
            )
            found.update(cursor.fetchall())
    pairs = [
        (_pk.to_python(job), Job(id=_pk.to_python(pk), kind=kind, status=status))
        for job, pk, kind, status in found
    ]
    return sorted(pairs, key=lambda pair: (str(pair[0]), str(pair[1].pk)))
