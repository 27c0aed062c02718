"""What an active retry holds from retention (``jobstate.worker.retention``): every
job earlier in its retry chain (A retried as B, B as C: C running holds B and A),
and the children of those jobs (a workflow retried with ``retry_from`` reads the
old job's children through its copied steps). Deleted, a job in the chain would
leave the next one's ``retry_of`` empty (``on_delete=SET_NULL``) while the chain
still runs.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Q
from django.db.models.expressions import RawSQL

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
    next one's ``retry_of`` is emptied under the running chain), and their children (a
    workflow retried with ``retry_from`` reads the old job's children, its copied
    steps naming them)."""
    cte, params = held_cte()
    ids = RawSQL(f"WITH RECURSIVE {cte} SELECT id FROM held", params)
    return Q(pk__in=ids) | Q(parent_id__in=ids)


def chains_locked(pks: list[Any]) -> list[Any]:
    """Those of ``pks`` (locked) whose retry chain from them on, and their parent's
    from it on, this transaction could lock (``FOR UPDATE SKIP LOCKED``): a retry
    being made of any of those jobs holds its row, and would hold the job (its
    parent's retry holds it as a child it reads)."""
    if not pks:
        return []
    table = connection.ops.quote_name(Job._meta.db_table)
    some = ", ".join(["%s"] * len(pks))
    ids = [_pk.get_db_prep_value(pk, connection) for pk in pks]
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE later(job, id) AS ("
            f"SELECT id, parent_id FROM {table} WHERE id IN ({some}) AND parent_id IS NOT NULL"
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
