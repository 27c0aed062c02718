"""Query-string filters for the job list (django-filter)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField, MultipleChoiceField

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


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class ChoicesField(MultipleChoiceField):
    """Lets ``""`` through: ``JobFilter.is_valid`` refuses it in its own words ("may not
    be empty"), as for every parameter; Django's refusal came as well, with the value
    left out ("Select a valid choice.  is not one of the available choices.")."""

    def valid_value(self, value: Any) -> bool:
        return value == "" or super().valid_value(value)


class InChoicesFilter(django_filters.MultipleChoiceFilter):
    """``?status=a&status=b`` as one ``status IN (a, b)``: index-friendly, and
    without the DISTINCT that MultipleChoiceFilter adds by default (a DISTINCT
    over every column sorts the whole match before the LIMIT)."""

    field_class = ChoicesField

    def filter(self, qs: Any, value: Any) -> Any:
        if not value:
            return qs
        return qs.filter(**{f"{self.field_name}__in": list(value)})


def choices_message(choices: Any) -> str:
    return "'%(value)s' is not one of: " + ", ".join(str(value) for value, _label in choices) + "."


class JobFilter(django_filters.FilterSet):
    status = InChoicesFilter(
        choices=Status.choices,
        error_messages={"invalid_choice": choices_message(Status.choices)},
        help_text="One or more statuses (repeat the parameter).",
    )
    # Matched as sent (strip=False), as an enqueue stores them: the form field stripped them,
    # so ?key=%20daily%20 listed the "daily" job and a blank one (stripped to "") listed all.
    kind = django_filters.CharFilter(max_length=200, strip=False, help_text="Registered handler name.")
    key = django_filters.CharFilter(max_length=255, strip=False, help_text="Idempotency key, as sent.")
    # Two filters, not a range filter, so that an error names the parameter sent
    # (a range filter's form field is "created", which no client sends).
    created_after = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Created at or after this time (ISO 8601)."
    )
    created_before = UTCIsoDateTimeFilter(
        field_name="created_at", lookup_expr="lte", help_text="Created at or before this time (ISO 8601)."
    )
    parent = django_filters.UUIDFilter(field_name="parent_id", help_text="Children of this workflow job.")
    retry_of = django_filters.UUIDFilter(field_name="retry_of_id", help_text="Retries of this job.")

    class Meta:
        model = Job
        fields = ["status", "kind", "key", "created_after", "created_before", "parent", "retry_of"]

    # django-filter ignores ``?kind=``; an API says that an empty value is not a value.
    # It takes the last of ``?kind=a&kind=b``: an API says that a single-valued parameter
    # is given once (``status`` alone repeats). Each parameter is its form field's name.
    PARAMETERS = ("status", "kind", "key", "created_after", "created_before", "parent", "retry_of")
    REPEATABLE = frozenset({"status"})

    def is_valid(self) -> bool:
        valid = super().is_valid()
        if self.data is None:  # (FilterSet keeps an empty dict instead)
            return valid
        getlist = getattr(self.data, "getlist", None)
        for param in self.PARAMETERS:
            values = getlist(param) if getlist else [self.data.get(param)]
            if param in self.data and "" in values:
                self.form.add_error(param, f"'{param}' may not be empty.")
                valid = False
            elif param not in self.REPEATABLE and len(values) > 1:
                self.form.add_error(param, f"'{param}' may be given once.")
                valid = False
        return valid
