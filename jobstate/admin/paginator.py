"""A paginator that never runs a full ``COUNT(*)`` on a huge table.

Filtered lists are counted up to a cap (``JOBSTATE["ADMIN_COUNT_CAP"]``) with
``SELECT COUNT(*) FROM (... LIMIT cap + 1)``, which an index answers quickly.
An unfiltered list on PostgreSQL takes the planner's row estimate
(``pg_class.reltuples``, kept fresh by autovacuum) when it is above the cap;
elsewhere (SQLite) the capped count applies to it too.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

from jobstate import conf


def estimated_rows(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of the rows in the queryset's table, or None."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    table = queryset.model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [connection.ops.quote_name(table)],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:  # -1: never analysed
        return None
    return int(row[0])


def is_unfiltered(queryset: QuerySet[Any]) -> bool:
    query = queryset.query
    return not query.where and not query.distinct and query.low_mark == 0 and query.high_mark is None


class CappedPaginator(Paginator):
    """``count`` is exact up to the cap; above it, an estimate (``is_estimate``) or
    the cap itself (``is_capped``), so pages stop at the cap."""

    def __init__(self, object_list: Any, per_page: int, *args: Any, cap: int | None = None, **kwargs: Any):
        super().__init__(object_list, per_page, *args, **kwargs)
        self.cap = int(conf.get("ADMIN_COUNT_CAP")) if cap is None else cap
        self.is_estimate = False
        self.is_capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if is_unfiltered(qs):
            estimate = estimated_rows(qs)
            if estimate is not None and estimate > self.cap:
                self.is_estimate = True
                return estimate
        counted = qs.order_by()[: self.cap + 1].count()
        if counted > self.cap:
            self.is_capped = True
            return self.cap
        return counted

    @property
    def count_label(self) -> str:
        n = self.count
        if self.is_estimate:
            return f"about {n:,}"
        if self.is_capped:
            return f"more than {n:,}"
        return f"{n:,}"
