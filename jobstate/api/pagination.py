"""Keyset ("cursor") pagination that stays fast on millions of rows.

DRF's CursorPagination keeps only the first ordering field in its cursor and
skips ties with an OFFSET, which degrades when many rows share a timestamp (bulk
enqueues do). Here the cursor holds the full sort key of the boundary row, the
ordering always ends with the primary key, and the next page is

    WHERE created_at <= :t AND (created_at < :t OR (created_at = :t AND id < :id))
    ORDER BY created_at DESC, id DESC LIMIT :n + 1

The redundant ``created_at <= :t`` gives the planner an index condition, so the
page is an index range scan however deep it is; no COUNT(*) is ever run.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Field, IntegerField, Model, Q, QuerySet
from django.utils import timezone
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from jobstate.api.times import as_stored

Ordering = tuple[str, ...]


# A cursor decodes to nested JSON: a long one could nest deep enough to be a 500.
CURSOR_MAX_LENGTH = 1024


class KeysetPagination(BasePagination):
    """Subclasses declare ``orderings`` (name -> fields, the last one unique and
    every one non-null) and ``default_ordering``; clients pick with ``?ordering=``."""

    orderings: dict[str, Ordering] = {}
    default_ordering = ""
    page_size = 50
    max_page_size = 500
    cursor_query_param = "cursor"
    page_size_query_param = "page_size"
    ordering_query_param = "ordering"

    # A queryset only (DRF's pagination also takes a list): the cursor filters and orders it.
    def paginate_queryset(  # type: ignore[override]
        self, queryset: QuerySet[Any], request: Request, view: Any = None
    ) -> list[Any]:
        self.request = request
        self.ordering_name = self._ordering_name(request)
        self.fields = self.orderings[self.ordering_name]
        self.size = self._page_size(request)
        position, reverse = self._decode_cursor(request, queryset.model)

        fields = [_flip(f) for f in self.fields] if reverse else list(self.fields)
        qs = queryset.order_by(*fields)
        if position is not None:
            qs = qs.filter(_after(fields, position))
        rows = list(qs[: self.size + 1])
        has_more = len(rows) > self.size
        rows = rows[: self.size]
        if reverse:
            rows.reverse()
            self.has_next, self.has_previous = position is not None, has_more
        else:
            self.has_next, self.has_previous = has_more, position is not None
        self.rows = rows
        return rows

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data})

    def get_next_link(self) -> str | None:
        if not self.has_next or not self.rows:
            return None
        return self._link(self.rows[-1], reverse=False)

    def get_previous_link(self) -> str | None:
        if not self.has_previous or not self.rows:
            return None
        return self._link(self.rows[0], reverse=True)

    # Cursor encoding -------------------------------------------------------

    def _link(self, row: Model, *, reverse: bool) -> str:
        values = [_jsonable(getattr(row, f.lstrip("-"))) for f in self.fields]
        payload = {"o": self.ordering_name, "v": values, **({"r": 1} if reverse else {})}
        token = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()
        url = self.request.build_absolute_uri()
        return replace_query_param(url, self.cursor_query_param, token.rstrip("="))

    def _decode_cursor(self, request: Request, model: type[Model]) -> tuple[list[Any] | None, bool]:
        raw = once(request, self.cursor_query_param)
        if raw is None:  # an empty one is invalid, as an empty ordering or page size
            return None, False
        try:
            if len(raw) > CURSOR_MAX_LENGTH:  # ours are a few dozen characters
                raise ValueError("cursor too long")
            payload = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            if not isinstance(payload, dict) or payload.get("o") != self.ordering_name:
                raise ValueError("cursor from another ordering")
            values = payload["v"]
            if not isinstance(values, list) or len(values) != len(self.fields):
                raise ValueError("wrong cursor length")
            position = [_cursor_value(model, f, v) for f, v in zip(self.fields, values, strict=True)]
            # With USE_TZ = False our own cursors hold naive times (as stored).
            naive = any(isinstance(v, datetime) and timezone.is_naive(v) for v in position)
            if any(v is None for v in position) or (naive and settings.USE_TZ):
                raise ValueError("empty or naive cursor value")
            # As the filters give theirs: PostgreSQL refuses an offset past ±15:59,
            # and a date at the calendar's edge overflows when converted.
            position = [as_stored(v) if isinstance(v, datetime) else v for v in position]
        except (
            ValueError,
            KeyError,
            TypeError,
            OverflowError,
            RecursionError,
            binascii.Error,
            DjangoValidationError,
            UnicodeDecodeError,
        ):
            raise ValidationError({self.cursor_query_param: ["Invalid cursor."]}) from None
        return position, bool(payload.get("r"))

    # Query parameters -------------------------------------------------------

    def _ordering_name(self, request: Request) -> str:
        name = once(request, self.ordering_query_param)
        name = self.default_ordering if name is None else name
        if name not in self.orderings:
            choices = ", ".join(self.orderings)
            raise ValidationError({self.ordering_query_param: [f"Choose one of: {choices}."]})
        return name

    def _page_size(self, request: Request) -> int:
        raw = once(request, self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number between 1 and {self.max_page_size}."]}
            )
        return size

    # Schema (drf-spectacular) ----------------------------------------------

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "Opaque position from a previous page's `next` or `previous` link.",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Results per page (default {self.page_size}).",
                "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size},
            },
            {
                "name": self.ordering_query_param,
                "required": False,
                "in": "query",
                "description": f"Sort order (default `{self.default_ordering}`).",
                "schema": {"type": "string", "enum": list(self.orderings)},
            },
        ]

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "format": "uri", "nullable": True}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }


def once(request: Request, param: str) -> str | None:
    """The parameter's value; given twice, a 400 (as the filters'), not the last one silently."""
    values: list[str] = request.query_params.getlist(param)
    if len(values) > 1:
        raise ValidationError({param: [f"'{param}' may be given once."]})
    return values[0] if values else None


def _flip(field: str) -> str:
    return field[1:] if field.startswith("-") else f"-{field}"


def _after(fields: list[str], position: list[Any]) -> Q:
    """Rows strictly after ``position`` in the order ``fields``."""
    names = [f.lstrip("-") for f in fields]
    ops = ["lt" if f.startswith("-") else "gt" for f in fields]
    strict = Q()
    for i in range(len(fields)):
        step = Q(**{f"{names[j]}": position[j] for j in range(i)}) & Q(
            **{f"{names[i]}__{ops[i]}": position[i]}
        )
        strict |= step
    # Index condition on the leading column (see the module docstring).
    return Q(**{f"{names[0]}__{ops[0]}e": position[0]}) & strict


def _cursor_value(model: type[Model], name: str, value: Any) -> Any:
    """A cursor's value for the field ``name``, if it has the JSON type ``_jsonable``
    writes for it: an integer for an integer field, a string for the others (times,
    ids). ``to_python`` coerced other types: ``5`` or ``true`` into a UUID, ``"5"``,
    ``5.5`` or ``true`` into an integer. An integer must also fit the column (see
    ``_integer_range``): no row holds one that does not."""
    field = cast("Field[Any, Any]", model._meta.get_field(name.lstrip("-")))  # not a relation
    wanted = int if isinstance(field, IntegerField) else str
    if type(value) is not wanted:  # not isinstance: a bool is an int
        raise TypeError(f"cursor value of type {type(value).__name__}")
    if isinstance(value, int):  # of the field's type, checked above
        low, high = _integer_range(field)
        if not low <= value <= high:
            raise ValueError("cursor value out of the column's range")
    return field.to_python(value)


def _integer_range(field: Field[Any, Any]) -> tuple[int, int]:
    """The range of ``field``'s column as PostgreSQL types it (a smallint for a
    SmallIntegerField), the same on every database (SQLite's own is 64 bits for every
    integer). Django turns a lookup past the range into an empty or full page, not an
    error, so the range is checked here."""
    ranges = BaseDatabaseOperations.integer_field_ranges
    return ranges.get(field.get_internal_type(), ranges["BigIntegerField"])


def _jsonable(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, int | float | str) or value is None:
        return value
    return str(value)


class JobPagination(KeysetPagination):
    # Newest first; served by the (owner, status, created_at), (status, created_at)
    # and (created_at) indexes.
    orderings = {
        "-created_at": ("-created_at", "-id"),
        "created_at": ("created_at", "id"),
        "-priority": ("-priority", "-created_at", "-id"),
        "priority": ("priority", "created_at", "id"),
    }
    default_ordering = "-created_at"


class EventPagination(KeysetPagination):
    # Insertion order is the truth (JobEvent.Meta): events are written under the
    # job's row lock, so ids follow the real sequence even when clocks disagree.
    # "created_at"/"-created_at" stay accepted as names of the same two orders.
    orderings = {"id": ("id",), "-id": ("-id",), "created_at": ("id",), "-created_at": ("-id",)}
    default_ordering = "id"
    page_size = 100


class AssetPagination(KeysetPagination):
    orderings = {"created_at": ("created_at", "id"), "-created_at": ("-created_at", "-id")}
    default_ordering = "-created_at"


class JobAssetPagination(AssetPagination):
    default_ordering = "created_at"  # in the order the job produced them
