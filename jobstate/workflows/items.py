"""The items ``ctx.iterate`` and ``ctx.batches`` walk: how many there are (for the
progress) and those from the step's cursor on. A QuerySet is never loaded whole: it is
counted with one COUNT query and read in chunks of LIMIT queries, each continuing
after the last row's ordering values (``workflows.keyset``) where that is exact, with
an OFFSET otherwise. ``Chunks.position`` is what a checkpoint stores (in the step's
``detail``, as ``READ_AFTER``) for a resume to continue after the same row; a resume
without it (a checkpoint written by an older release, another ordering) starts with
an OFFSET of the cursor's item count. Read by keyset, a QuerySet is counted and read
only up to its last row when the loop began (``keyset.upto``; kept in the position):
rows added after it while the step runs are not walked. ``walk`` also says when there
are no items at all: such a loop is not the step's iteration (``StepContext._iterating``).

The chunks are ordered on the primary key last (``by_pk_last``): ordered on a field with
equal values (``-created_at``, ``status``), PostgreSQL may return the rows that tie
in any order in each query, so a row could be skipped by one chunk and repeated by the
next. A grouped ``values()`` queryset (``.values(...).annotate(...)``), a ``values()``
queryset with ``.distinct()`` that does not select the pk, a combined one (``union``)
or one ordered with ``extra()`` is read as ordered: adding the pk would change its rows
(it would join the GROUP BY, or the DISTINCT columns) or cannot be done. Order those
on a unique key of their own (for ``values(...).distinct()``: every selected field).
A sliced queryset (``qs.order_by("name")[:10]``) is the same slice of its rows ordered
with the pk last: the rows that tie across the slice's edges are then the same on
every attempt."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, islice
from typing import Any, TypeGuard

from django.db.models import F, OrderBy, QuerySet

from jobstate.workflows import keyset
from jobstate.workflows.keyset import ordering_of

# Rows per query when reading a QuerySet (or the step's interval, if larger).
READ_CHUNK = 1000
# The key of ``JobStep.detail`` where a checkpoint keeps ``Chunks.position``.
READ_AFTER = "read_after"
# The key of ``JobStep.detail`` where a checkpoint keeps which of the step's loops it is
# (from 0, loops over nothing counted): only that one may resume from the cursor.
LOOP = "loop"
_END = object()


def walk(
    items: Iterable[Any], start: int, chunk: int, stored: Any = None
) -> tuple[Iterable[Any], int | None]:
    """``rows_from(items, ...)`` and the number of items: 0 when there are none (an
    iterator is asked for its first item), None when only iterating them would tell."""
    total: int | None = None
    if not _unread(items):
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            it = iter(items)
            first = next(it, _END)
            if first is _END:
                return (), 0
            items = chain((first,), it)
    rows = rows_from(items, start, chunk, stored)
    return rows, rows.count() if isinstance(rows, Chunks) else total


def rows_from(items: Iterable[Any], start: int, chunk: int, stored: Any = None) -> Iterable[Any]:
    """``items`` from the ``start``-th on; a QuerySet read ``chunk`` rows (at least
    ``READ_CHUNK``) a query, after the row ``stored`` (a ``Chunks.position``) names
    if it was taken at ``start`` over the same ordering."""
    if _unread(items):
        if not items.ordered:
            before = " before slicing" if items.query.is_sliced else ""
            raise ValueError(
                "iterate/batches read a queryset in chunks and resume by position: "
                f'order it{before}, e.g. .order_by("pk")'
            )
        return Chunks(by_pk_last(items), start, max(chunk, READ_CHUNK), stored)
    if not start:
        return items
    if hasattr(items, "__getitem__") and not isinstance(items, Mapping):
        try:
            rest: Iterable[Any] = items[start:]
            return rest
        except TypeError:
            pass
    return islice(iter(items), start, None)


def _unread(items: Iterable[Any]) -> TypeGuard[QuerySet[Any]]:
    """A QuerySet not yet evaluated (an evaluated one is a list already)."""
    return isinstance(items, QuerySet) and items._result_cache is None


def by_pk_last(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """``queryset`` (ordered) with the primary key as its ordering's last tie-breaker,
    so that its order is total, unless it already ends with the pk or adding it
    would change its rows (see the module's docstring)."""
    query = queryset.query
    if query.combinator or query.extra_order_by:
        return queryset
    if query.is_sliced:  # Django reorders no slice: the same slice of the reordered rows
        whole = queryset.all()
        whole.query.clear_limits()
        ordered = by_pk_last(whole)
        ordered.query.set_limits(query.low_mark, query.high_mark)
        return ordered
    ordering = ordering_of(queryset)
    pk = queryset.model._meta.pk
    names = {"pk", pk.attname} | ({pk.name} if pk.attname == pk.name else set())
    if ordering and _field_name(ordering[-1]) in names:
        return queryset
    selects_pk = not query.values_select or bool(names & set(query.values_select))
    if not selects_pk and (query.group_by is not None or (query.distinct and not query.distinct_fields)):
        return queryset
    return queryset.order_by(*ordering, "pk")


def _field_name(term: Any) -> str | None:
    """The field an ordering term names (``"-id"``, ``F("pk").desc()``), if it is one."""
    if isinstance(term, str):
        return term.removeprefix("-")
    if isinstance(term, OrderBy):
        term = term.expression
    return str(term.name) if isinstance(term, F) else None  # type: ignore[attr-defined]


def position_of(rows: Iterable[Any]) -> dict[str, Any] | None:
    """Where a keyset read of ``rows_from`` stands (None: not read by keyset)."""
    return rows.position() if isinstance(rows, Chunks) else None


class Chunks:
    """A QuerySet's rows from the ``start``-th on, ``size`` a query; read by keyset, up
    to its last row when the read began (``until``, kept in the position for a resume)."""

    def __init__(self, queryset: QuerySet[Any], start: int, size: int, stored: Any) -> None:
        self.queryset = queryset
        self.size = size
        self.done = start
        self.keyset = keyset.plan(queryset)
        self._last: tuple[Any, ...] | None = None  # the ordering values of the last row handed out
        self._after: tuple[Any, ...] | None = None
        self._until: tuple[Any, ...] | None = None
        self._bounded: QuerySet[Any] | None = None
        plan = self.keyset
        if (
            plan
            and isinstance(stored, dict)
            and (stored.get("at"), stored.get("order")) == (start, plan.signature)
        ):
            self._after = keyset.decode(plan, stored.get("after"))
            self._until = keyset.decode(plan, stored.get("until"))

    def rows(self) -> QuerySet[Any]:
        """The queryset bounded by ``until`` (taken from its last row, one query, unless
        a stored position gave it); as it is when read with OFFSET."""
        if self._bounded is None:
            plan, until, self._bounded = self.keyset, self._until, self.queryset
            if plan is not None and until is None:
                last = list(self.queryset.reverse()[:1])
                if not last:  # nothing matched when the read began
                    self._bounded = self.queryset.none()
                    return self._bounded
                until = self._until = plan.key(last[0])
            if plan is not None and until is not None:
                self._bounded = self.queryset.filter(keyset.upto(plan, until))
        return self._bounded

    def count(self) -> int:
        return self.rows().count()

    def __iter__(self) -> Iterator[Any]:
        offset, after, plan, bounded = self.done, self._after, self.keyset, self.rows()
        while True:
            if plan is not None and after is not None:
                rows = list(bounded.filter(keyset.after(plan, after))[: self.size])
            else:
                rows = list(bounded[offset : offset + self.size])
            # Taken as read: the step may change a row's fields before the checkpoint.
            keys = [plan.key(row) for row in rows] if plan is not None else []
            for i, row in enumerate(rows):
                self.done += 1
                self._last = keys[i] if keys else None
                yield row
            if len(rows) < self.size:
                return
            offset += self.size
            after = keys[-1] if keys else None

    def position(self) -> dict[str, Any] | None:
        """JSON for ``rows_from(..., stored=)`` to continue after the last row handed out."""
        if self.keyset is None or self._last is None:
            return None
        values = keyset.encode(self._last)
        if values is None:
            return None
        until = keyset.encode(self._until) if self._until is not None else None
        return {"at": self.done, "order": self.keyset.signature, "after": values, "until": until}
