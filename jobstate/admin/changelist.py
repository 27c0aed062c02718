"""ChangeLists for the jobstate admin lists.

``SafeChangeList`` answers bad filter input as bad input, never as a 500: NUL
characters (PostgreSQL refuses them in text) are dropped from the filters, and
values Django only rejects while building or compiling the query (``year=0``,
``year=9999&month=12``), or the database only while running it (an offset of
``+23:00``), reset the filters with a message, as Django does for other invalid
lookups. Only the declared filters filter: Django would apply any lookup on the
model's own fields from the query string (``?key__regex=...``, a slow-regex
denial of service), and those reset the filters too.

``JobChangeList`` adds a date hierarchy that stays cheap. Django's own
drill-down runs ``SELECT DISTINCT date_trunc(...)`` over every matching row.
Here the levels come from an index: MIN/MAX of the field, then one ``EXISTS``
probe per candidate year, month or day.
"""

from __future__ import annotations

import calendar
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin import helpers, widgets
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, ChangeList
from django.core.exceptions import EmptyResultSet
from django.db import DatabaseError, connections, transaction
from django.db.models import Max, Min, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst

from jobstate.admin import display
from jobstate.admin.keys import valid_keys


def _has_nul(text: str) -> bool:
    return "\x00" in text


class SafeChangeList(ChangeList):
    def get_filters_params(self, params: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
        lookups = super().get_filters_params(params)
        kept = {}
        for key, values in lookups.items():
            clean = [v for v in values if not _has_nul(v)]
            if clean and not _has_nul(key):
                kept[key] = clean
        return kept

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            found = super().get_filters(request)
        except (DisallowedModelAdminLookup, ValueError, OverflowError) as exc:  # ValueError: year 9999
            raise IncorrectLookupParameters(exc) from exc
        # What no list filter took is applied as a plain lookup: only the date
        # hierarchy's and the ones the admin links to (``extra_lookups``).
        asked = self.get_filters_params()
        allowed = set(getattr(self.model_admin, "extra_lookups", ()))
        if field := self.date_hierarchy:
            allowed |= {f"{field}__month", f"{field}__day"}  # without a year
            if f"{field}__year" in asked:
                allowed |= {f"{field}__gte", f"{field}__lt"}  # the bounds Django made of it
        for key in found[2]:
            values = asked.get(key, [])
            if key not in allowed and not (values and all(_popup_lookup(self.model, key, v) for v in values)):
                raise IncorrectLookupParameters(f"Filtering by {key} is not allowed")
        return found

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        qs = super().get_queryset(request, exclude_parameters)
        # Some lookups fail only when the SQL is compiled (``created_at__year=0``),
        # which would be while the page renders: compile here (no query runs).
        try:
            qs.query.get_compiler(using=qs.db).as_sql()
        except EmptyResultSet:
            pass
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return qs

    def get_results(self, request: Any) -> None:
        if not (self.get_filters_params() or self.query):
            super().get_results(request)  # an error without filters is no bad input
            return
        # The count and the page's rows run here, so that an error the database raises
        # for a filter value is answered as bad input. Inside a transaction
        # (ATOMIC_REQUESTS) in a savepoint, which leaves the transaction usable; not
        # otherwise: on SQLite a transaction of its own would take the write lock.
        db = self.queryset.db
        guard = transaction.atomic(using=db) if connections[db].in_atomic_block else nullcontext()
        try:
            with guard:
                super().get_results(request)
                if isinstance(self.result_list, QuerySet):
                    len(self.result_list)  # fetched now, and kept for the page
        except (DatabaseError, ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


def _popup_lookup(model: Any, key: str, value: str) -> bool:
    """A filter Django's raw-id popups add from a ``limit_choices_to`` pointing at ``model``."""
    for lookup in model._meta.related_fkey_lookups:
        params = widgets.url_params_from_lookup_dict(lookup() if callable(lookup) else lookup)
        if params.get(key) == value:
            return True
    return False


class SafeListAdmin:
    """ModelAdmin mixin: the safe ChangeList, and a message when filters are reset."""

    changelist_class: type[SafeChangeList] = SafeChangeList
    # Plain lookups the admin's own links use, beyond the list filters.
    extra_lookups: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[SafeChangeList]:
        return self.changelist_class

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)  # type: ignore[misc]
        except IncorrectLookupParameters as exc:
            if ERROR_FLAG not in request.GET:  # Django redirects to the unfiltered list
                messages.warning(request, f"The filters were not valid and have been cleared ({exc}).")
            raise

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        # A text primary key (a worker process's name) is looked up as given, and
        # PostgreSQL refuses a NUL in text: no row has one, so none is found.
        if _has_nul(object_id):
            return None
        return super().get_object(request, object_id, from_field)  # type: ignore[misc]

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # Django filters ``pk__in`` with the posted ids as they are: one malformed
        # id raises (a 500). Without it, none valid is Django's "no items selected".
        name = helpers.ACTION_CHECKBOX_NAME
        selected = request.POST.getlist(name)
        kept = valid_keys(queryset.model._meta.pk, selected)
        if len(kept) != len(selected):
            post = request.POST.copy()
            post.setlist(name, kept)
            request.POST = post  # type: ignore[assignment]
        response: HttpResponse | None = super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]
        return response


class JobChangeList(SafeChangeList):
    @cached_property
    def cheap_date_hierarchy(self) -> dict[str, Any]:
        field = self.date_hierarchy
        if not field:
            return {"show": False}
        year_f, month_f, day_f = f"{field}__year", f"{field}__month", f"{field}__day"
        y, m, d = (_int(self.params.get(k)) for k in (year_f, month_f, day_f))
        # Without a year Django applies a month or day as a plain lookup (every May):
        # the levels start at the years then. A day without a month shows the months.
        if y is None:
            m = None
        if m is None:
            d = None

        def link(filters: dict[str, Any]) -> str:
            return self.get_query_string(filters, [f"{field}__"])

        if y is None:
            first, last = self._bounds()
            if first is None or last is None:
                return {"show": True, "back": None, "choices": []}
            if first.year != last.year:
                years = [y for y in range(first.year, last.year + 1) if self._any(_span(y))]
                return {
                    "show": True,
                    "back": None,
                    "choices": [{"link": link({year_f: str(y)}), "title": str(y)} for y in years],
                }
            y = first.year
            if first.month == last.month:
                m = first.month
        if m and d:
            moment = datetime(y, m, d)
            return {
                "show": True,
                "back": {"link": link({year_f: y, month_f: m}), "title": _fmt(moment, "YEAR_MONTH_FORMAT")},
                "choices": [{"title": _fmt(moment, "MONTH_DAY_FORMAT")}],
            }
        if m:
            lo, hi = self._bounds()
            days = range(1, calendar.monthrange(y, m)[1] + 1)
            if lo is not None and hi is not None:
                days = range(
                    lo.day if (lo.year, lo.month) == (y, m) else 1,
                    (hi.day if (hi.year, hi.month) == (y, m) else days[-1]) + 1,
                )
            found = [dd for dd in days if lo is not None and self._any(_span(y, m, dd))]
            return {
                "show": True,
                "back": {"link": link({year_f: y}), "title": str(y)},
                "choices": [
                    {
                        "link": link({year_f: y, month_f: m, day_f: dd}),
                        "title": _fmt(datetime(y, m, dd), "MONTH_DAY_FORMAT"),
                    }
                    for dd in found
                ],
            }
        lo, hi = self._bounds()
        months: Sequence[int] = range(1, 13)
        if lo is not None and hi is not None:
            months = range(lo.month if lo.year == y else 1, (hi.month if hi.year == y else 12) + 1)
        months = [mm for mm in months if lo is not None and self._any(_span(y, mm))]
        return {
            "show": True,
            "back": {"link": link({}), "title": "All dates"},
            "choices": [
                {
                    "link": link({year_f: y, month_f: mm}),
                    "title": _fmt(datetime(y, mm, 1), "YEAR_MONTH_FORMAT"),
                }
                for mm in months
            ],
        }

    def _bounds(self) -> tuple[datetime | None, datetime | None]:
        """First and last value in the (already date-filtered) list: one index probe each."""
        if not hasattr(self, "_bounds_cache"):
            field = self.date_hierarchy
            got = self.queryset.order_by().aggregate(first=Min(field), last=Max(field))
            self._bounds_cache = tuple(
                display.local(v) if v is not None else None for v in (got["first"], got["last"])
            )
        return self._bounds_cache  # type: ignore[return-value]

    def _any(self, span: tuple[datetime, datetime]) -> bool:
        field = self.date_hierarchy
        # ORDER BY the field: walks its index from the span's start (a bare EXISTS
        # may be planned as a sequential scan that crosses every older row first).
        rows = self.queryset.filter(**{f"{field}__gte": span[0], f"{field}__lt": span[1]})
        return rows.order_by(field).values_list(field, flat=True).first() is not None


def _int(value: Any) -> int | None:
    if isinstance(value, list | tuple):
        value = value[-1] if value else None
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _span(year: int, month: int | None = None, day: int | None = None) -> tuple[datetime, datetime]:
    tz = timezone.get_current_timezone() if settings.USE_TZ else None  # naive, as stored then
    if day is not None and month is not None:
        start = datetime(year, month, day, tzinfo=tz)
        return start, start + timedelta(days=1)
    if month is not None:
        start = datetime(year, month, 1, tzinfo=tz)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=tz)
        return start, end
    return datetime(year, 1, 1, tzinfo=tz), datetime(year + 1, 1, 1, tzinfo=tz)


def _fmt(moment: datetime, fmt: str) -> str:
    return str(capfirst(formats.date_format(moment, fmt)))
