"""Keyset reading of an ordered QuerySet (``workflows.items``): each chunk after the
first continues after the last row's ordering values,

    WHERE a >= :x AND (a > :x OR (a = :x AND (b > :y OR (b = :y AND id > :z))))

so a chunk costs the same however deep it is (an OFFSET reads and drops every row
before it). Used only where it gives exactly the rows OFFSET would: every ordering
term a concrete field of the model (not a relation, transform or expression),
the last one the primary key, each row's values readable from the row itself,
no DISTINCT ON, union or slice. NULLs sort as the backend sorts them
(``nulls_order_largest``: last ascending on PostgreSQL, first on SQLite) or as
``nulls_first``/``nulls_last`` say. ``plan`` answers None for any other queryset:
it is read with OFFSET.

``upto`` bounds a read to the rows up to the last one when it began (``items.Chunks``).
A resume after a crash continues after the values ``encode`` stored (JSON;
datetimes to the microsecond, decimals and UUIDs as text) and ``decode`` gives back."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import connections
from django.db.models import F, Field, Model, OrderBy, Q, QuerySet
from django.db.models.query import (
    FlatValuesListIterable,
    ModelIterable,
    NamedValuesListIterable,
    ValuesIterable,
    ValuesListIterable,
)
from django.utils.duration import duration_iso_string

from jobstate.storable import json_text

# Columns whose values compare in SQL as Python compares what they read back, and
# come back from JSON whole.
KEY_TYPES = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
        "BooleanField",
        "CharField",
        "SlugField",
        "TextField",
        "DateField",
        "DateTimeField",
        "TimeField",
        "DurationField",
        "DecimalField",
        "FloatField",
        "UUIDField",
    }
)
ROW_ITERABLES = (ValuesIterable, ValuesListIterable, NamedValuesListIterable, FlatValuesListIterable)


@dataclass(frozen=True)
class Term:
    field: Field[Any, Any]
    descending: bool
    nulls_last: bool

    @property
    def name(self) -> str:
        return str(self.field.attname)


@dataclass(frozen=True)
class Keyset:
    terms: tuple[Term, ...]
    key: Callable[[Any], tuple[Any, ...]]  # a row's values of the terms, as read
    signature: str  # what a stored position was taken over


def ordering_of(queryset: QuerySet[Any]) -> list[Any]:
    """The queryset's ordering terms, its model's ``Meta.ordering`` if none is given."""
    query = queryset.query
    default = (query.get_meta().ordering or ()) if query.default_ordering else ()
    return list(query.order_by or default)


def plan(queryset: QuerySet[Any]) -> Keyset | None:
    """How to read ``queryset`` (ordered, pk last: ``items.by_pk_last``) by keyset;
    None: with OFFSET (see the module's docstring)."""
    query = queryset.query
    if query.combinator or query.extra_order_by or query.distinct_fields or query.is_sliced:
        return None
    largest = connections[queryset.db].features.nulls_order_largest
    terms = []
    for raw in ordering_of(queryset):
        term = _term(queryset.model, raw, reverse=not query.standard_ordering, nulls_largest=largest)
        if term is None:
            return None
        terms.append(term)
    if not terms or not terms[-1].field.primary_key:
        return None
    key = _key_of(queryset, terms)
    if key is None:
        return None
    signature = ",".join(
        f"{'-' if t.descending else ''}{t.name}{' nulls last' if t.nulls_last else ''}" for t in terms
    )
    return Keyset(tuple(terms), key, f"{queryset.model._meta.label}:{signature}")


def _term(model: type[Model], raw: Any, *, reverse: bool, nulls_largest: bool) -> Term | None:
    nulls: bool | None = None  # explicit: True NULLS LAST, False NULLS FIRST
    if isinstance(raw, str):
        descending, name = raw.startswith("-"), raw.removeprefix("-")
    elif isinstance(raw, OrderBy) and type(raw.expression) is F:
        descending, name = raw.descending, str(raw.expression.name)  # type: ignore[attr-defined]
        nulls = True if raw.nulls_last else False if raw.nulls_first else None
    elif type(raw) is F:
        descending, name = False, str(raw.name)  # type: ignore[attr-defined]
    else:
        return None
    meta = model._meta
    try:
        field = meta.pk if name == "pk" else meta.get_field(name)
    except FieldDoesNotExist:
        return None
    if not isinstance(field, Field) or not field.concrete or field.many_to_many:
        return None
    # Ordered by a relation's name, rows follow the related model's ordering.
    if field.is_relation and name not in ("pk", field.attname):
        return None
    target = getattr(field, "target_field", field) if field.is_relation else field
    if target.get_internal_type() not in KEY_TYPES:
        return None
    if reverse:  # .reverse(): every direction and explicit NULLS placement flips
        descending, nulls = not descending, None if nulls is None else not nulls
    nulls_last = nulls if nulls is not None else nulls_largest != descending
    return Term(field, descending, nulls_last)


def _key_of(queryset: QuerySet[Any], terms: list[Term]) -> Callable[[Any], tuple[Any, ...]] | None:
    """How to read the terms' values from a row the queryset yields (None: they are not in it)."""
    query = queryset.query
    iterable = queryset._iterable_class
    flat, as_dict = iterable is FlatValuesListIterable, iterable is ValuesIterable
    if iterable is ModelIterable:
        deferred, defer = query.deferred_loading
        for t in terms:
            named = t.field.name in deferred or t.name in deferred
            if deferred and not t.field.primary_key and named == defer:
                return None  # reading it would be a query per row
        names = [t.name for t in terms]
        return lambda row: tuple(getattr(row, n) for n in names)
    if iterable not in ROW_ITERABLES:
        return None
    if query.selected:
        names = list(query.selected)
    else:
        names = [*query.extra_select, *query.values_select, *query.annotation_select]
    at: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in query.extra_select or name in query.annotation_select:
            continue
        try:
            field = query.get_meta().pk if name == "pk" else query.get_meta().get_field(name)
        except FieldDoesNotExist:
            continue
        at.setdefault(str(getattr(field, "attname", name)), i)
    if any(t.name not in at for t in terms):
        return None
    places = [at[t.name] for t in terms]
    if flat:
        return (lambda row: (row,) * len(places)) if set(places) == {0} else None
    keys: list[Any] = [names[p] for p in places] if as_dict else places
    return lambda row: tuple(row[k] for k in keys)


def after(keyset: Keyset, values: Sequence[Any]) -> Q:
    """The rows strictly after ``values`` in the keyset's order."""
    rest: Q | None = None  # from the last term back: rows after on the terms from here on
    for term, value in reversed(list(zip(keyset.terms, values, strict=True))):
        same = Q(**{f"{term.name}__isnull": True}) if value is None else Q(**{term.name: value})
        parts = [p for p in (_beyond(term, value), same & rest if rest is not None else None) if p]
        rest = parts[0] | parts[1] if len(parts) == 2 else parts[0] if parts else None
    if rest is None:
        return Q(pk__in=[])
    first, value = keyset.terms[0], values[0]
    if value is None:
        return rest
    # Redundant: a range on the leading column, which an index can serve.
    lead = Q(**{f"{first.name}__{'lte' if first.descending else 'gte'}": value})
    if first.nulls_last and first.field.null:
        lead |= Q(**{f"{first.name}__isnull": True})
    return lead & rest


def upto(keyset: Keyset, values: Sequence[Any]) -> Q:
    """The rows up to ``values`` (a row's, the pk last) in the keyset's order, that row
    included: the rows strictly after them in the reversed order, or that row."""
    flipped = tuple(
        replace(t, descending=not t.descending, nulls_last=not t.nulls_last) for t in keyset.terms
    )
    pk = keyset.terms[-1]
    return after(replace(keyset, terms=flipped), values) | Q(**{pk.name: values[-1]})


def _beyond(term: Term, value: Any) -> Q | None:
    """Rows whose ``term`` comes strictly after ``value``; None: none can."""
    nulls = Q(**{f"{term.name}__isnull": True}) if term.field.null else None
    if value is None:
        return None if term.nulls_last else Q(**{f"{term.name}__isnull": False})
    beyond = Q(**{f"{term.name}__{'lt' if term.descending else 'gt'}": value})
    return beyond | nulls if term.nulls_last and nulls is not None else beyond


def encode(values: Sequence[Any]) -> list[Any] | None:
    """``values`` as JSON that ``decode`` turns back into the same values; None when
    one cannot be stored (NaN, a NUL character, ...): a resume then reads with OFFSET."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, datetime.datetime | datetime.date | datetime.time):
            out.append(v.isoformat())  # (Django's JSON encoder cuts times to milliseconds)
        elif isinstance(v, datetime.timedelta):
            out.append(duration_iso_string(v))
        elif isinstance(v, decimal.Decimal | uuid.UUID):
            out.append(str(v))
        elif v is None or isinstance(v, bool | int | float | str):
            out.append(v)
        else:
            return None
    try:
        json_text(out, "key")
    except ValidationError:
        return None
    return out


def decode(keyset: Keyset, stored: Any) -> tuple[Any, ...] | None:
    """The values ``encode`` stored for ``keyset``'s terms (None: unreadable)."""
    if not isinstance(stored, list) or len(stored) != len(keyset.terms):
        return None
    try:
        return tuple(
            None if v is None else t.field.to_python(v) for t, v in zip(keyset.terms, stored, strict=True)
        )
    except (ValidationError, ValueError, TypeError, OverflowError):
        return None
