"""Query-string filters for the job list (django-filter)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField, IsoDateTimeRangeField, RangeField

from jobstate.api.times import as_stored
from jobstate.models import Job
from jobstate.states import Status


class UTCIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, normalised to UTC so the database never sees an
    offset it refuses (PostgreSQL stops at ±15:59) or a value that overflows;
    with ``USE_TZ = False``, naive in ``TIME_ZONE`` (``as_stored``)."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return as_stored(parsed)
        except OverflowError:
            raise ValidationError("Date-time out of range.", code="invalid") from None


class UTCIsoDateTimeRangeField(IsoDateTimeRangeField):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        RangeField.__init__(self, (UTCIsoDateTimeField(), UTCIsoDateTimeField()), *args, **kwargs)


class UTCIsoDateTimeFromToRangeFilter(django_filters.IsoDateTimeFromToRangeFilter):
    field_class = UTCIsoDateTimeRangeField


class InChoicesFilter(django_filters.MultipleChoiceFilter):
    """``?status=a&status=b`` as one ``status IN (a, b)``: index-friendly, and
    without the DISTINCT that MultipleChoiceFilter adds by default (a DISTINCT
    over every column sorts the whole match before the LIMIT)."""

    def filter(self, qs: Any, value: Any) -> Any:
        if not value:
            return qs
        return qs.filter(**{f"{self.field_name}__in": list(value)})


class JobFilter(django_filters.FilterSet):
    status = InChoicesFilter(choices=Status.choices, help_text="One or more statuses (repeat the parameter).")
    # Matched as sent (strip=False), as an enqueue stores them: the form field stripped them,
    # so ?key=%20daily%20 listed the "daily" job and a blank one (stripped to "") listed all.
    kind = django_filters.CharFilter(max_length=200, strip=False, help_text="Registered handler name.")
    key = django_filters.CharFilter(max_length=255, strip=False, help_text="Idempotency key, as sent.")
    created = UTCIsoDateTimeFromToRangeFilter(
        field_name="created_at",
        help_text="Created at or after `created_after` and at or before `created_before` (ISO 8601).",
    )
    parent = django_filters.UUIDFilter(field_name="parent_id", help_text="Children of this workflow job.")
    retry_of = django_filters.UUIDFilter(field_name="retry_of_id", help_text="Retries of this job.")

    class Meta:
        model = Job
        fields = ["status", "kind", "key", "created", "parent", "retry_of"]

    # Query parameter -> form field. django-filter ignores ``?kind=``; an API
    # says that an empty value is not a value. It takes the last of ``?kind=a&kind=b``:
    # an API says that a single-valued parameter is given once (``status`` alone repeats).
    PARAMETERS = {
        "status": "status",
        "kind": "kind",
        "key": "key",
        "created_after": "created",
        "created_before": "created",
        "parent": "parent",
        "retry_of": "retry_of",
    }
    REPEATABLE = frozenset({"status"})

    def is_valid(self) -> bool:
        valid = super().is_valid()
        if self.data is None:  # (FilterSet keeps an empty dict instead)
            return valid
        getlist = getattr(self.data, "getlist", None)
        for param, field in self.PARAMETERS.items():
            values = getlist(param) if getlist else [self.data.get(param)]
            if param in self.data and "" in values:
                self.form.add_error(field, f"'{param}' may not be empty.")
                valid = False
            elif param not in self.REPEATABLE and len(values) > 1:
                self.form.add_error(field, f"'{param}' may be given once.")
                valid = False
        return valid
