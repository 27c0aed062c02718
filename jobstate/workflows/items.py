"""The items ``ctx.iterate`` and ``ctx.batches`` walk: how many there are (for the
progress) and those from the step's cursor on. A QuerySet is never loaded whole: it is
counted with one COUNT query and read in chunks of LIMIT/OFFSET queries."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, TypeGuard

from django.db.models import QuerySet

# Rows per query when reading a QuerySet (or the step's interval, if larger).
READ_CHUNK = 1000


def length(items: Iterable[Any]) -> int | None:
    """The number of items, or None when only iterating them would tell."""
    if _unread(items):
        return items.count()
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None


def rows_from(items: Iterable[Any], start: int, chunk: int) -> Iterable[Any]:
    """``items`` from the ``start``-th on; a QuerySet read ``chunk`` rows (at least
    ``READ_CHUNK``) a query."""
    if _unread(items):
        if not items.ordered:
            raise ValueError(
                "iterate/batches read a queryset in chunks and resume by position: "
                'order it, e.g. .order_by("pk")'
            )
        return _chunks(items, start, max(chunk, READ_CHUNK))
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


def _chunks(queryset: QuerySet[Any], start: int, size: int) -> Iterator[Any]:
    while True:
        rows = list(queryset[start : start + size])
        yield from rows
        if len(rows) < size:
            return
        start += size
