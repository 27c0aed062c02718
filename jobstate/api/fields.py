"""The API's fields: strict JSON inputs (a string is a string, a boolean a boolean;
text checked for what JSON or PostgreSQL cannot carry), request parameters bounded in
size and depth, and date-times in and out (out: ISO 8601 in UTC).

Only shapes and bounds: whether a job may be created or moved is decided by
jobstate.services.
"""

from __future__ import annotations

import json
from datetime import datetime, tzinfo
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from jobstate import conf
from jobstate.api.times import as_stored, as_written
from jobstate.storable import MAX_DEPTH, too_deep


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise serializers.ValidationError("Null characters are not allowed.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("Text must be valid Unicode.") from None
    return value


class UTCDateTimeField(serializers.DateTimeField):
    """ISO 8601 in UTC ("…Z"), whatever the active time zone: instants, the same
    for every client. Also skips DRF's per-value time-zone lookup, which is a
    good part of a 50-row page's serialization time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The API's format, not the project's REST_FRAMEWORK["DATETIME_FORMAT"].
        kwargs.setdefault("format", ISO_8601)
        super().__init__(*args, **kwargs)

    # DRF's own returns None for an empty value too (its stub says str).
    def to_representation(self, value: Any) -> str | None:  # type: ignore[override]
        if not value:
            return None
        output_format = getattr(self, "format", api_settings.DATETIME_FORMAT)
        iso = isinstance(output_format, str) and output_format.lower() == ISO_8601
        if iso and isinstance(value, datetime) and (value.tzinfo is not None or not settings.USE_TZ):
            return as_written(value)
        return super().to_representation(value)


class AwareDateTimeField(serializers.DateTimeField):
    """An input time kept timezone-aware (a naive one is read in the current time zone),
    as the services take it, with ``USE_TZ = False`` too: DRF made it naive then, and
    the service refused it."""

    def default_timezone(self) -> tzinfo:
        return timezone.get_current_timezone()

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            return super().enforce_timezone(value)
        except OverflowError:
            # DRF's check of a naive time at the calendar's edge converts it to UTC
            # (9999-12-31T23:59 in New York): its "overflow" error, not a 500.
            self.fail("overflow")


class StoredDateTimeField(AwareDateTimeField):
    """An input time to compare with stored ones (``as_stored``): with ``USE_TZ = False``
    DRF made it naive in UTC, hours off the times Django stores then (in ``TIME_ZONE``)."""

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            return as_stored(super().enforce_timezone(value))
        except OverflowError:
            self.fail("overflow")


class StrictCharField(serializers.CharField):
    """A string, and only a string (DRF's CharField would accept numbers)."""

    # Its own key: a subclass's "invalid" (a URL's) is another message.
    default_error_messages = {"not_a_string": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return _check_text(super().to_internal_value(data))


class StrictURLField(StrictCharField, serializers.URLField):
    """A URL, given as a string."""


class StrictChoiceField(serializers.ChoiceField):
    """One of the string choices, given as a string (DRF's compares ``str(data)``).
    Text checked first: DRF's refusal repeats the value, and a lone surrogate in
    the error made the response a 500 (JSON cannot encode it)."""

    default_error_messages = {"not_a_string": "Not a valid string."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(_check_text(data))


class QueryChoicesField(serializers.MultipleChoiceField):
    """A repeatable query parameter's values, each one of the choices; an empty one is
    "may not be empty" as for the job list's filters (DRF's said '"" is not a valid
    choice.'), and a wrong one lists the choices."""

    default_error_messages = {
        "blank": "'{name}' may not be empty.",
        "invalid_choice": "'{input}' is not one of: {choices}.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str) and hasattr(data, "__iter__"):
            for item in data:
                if item == "":
                    self.fail("blank", name=self.field_name)
                if str(item) not in self.choice_strings_to_values:
                    self.fail("invalid_choice", input=item, choices=", ".join(self.choice_strings_to_values))
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean (DRF's BooleanField would accept "yes", "on", "1", 1 and 0)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer (not a string, a float or a boolean)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A JSON number, integer or not (not a string or a boolean)."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "additionalProperties": True})
class ParametersField(serializers.Field[Any, Any, Any, Any]):
    """A JSON object: only size and plain-text checks here; the handler's schema
    validates the content (in jobstate.services)."""

    default_error_messages = {
        "not_object": "Parameters must be a JSON object.",
        "too_large": "Parameters are {size} bytes; the limit is {limit}.",
        "too_deep": f"Parameters are nested more than {MAX_DEPTH} levels deep.",
    }

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("not_object")
        try:
            encoded = json.dumps(data, separators=(",", ":"))
        except RecursionError:
            self.fail("too_deep")
        size = len(encoded.encode())
        limit = conf.get("MAX_PARAMETERS_BYTES")
        if size > limit:
            self.fail("too_large", size=size, limit=limit)
        if too_deep(encoded):  # after the size: its cost grows with the text
            self.fail("too_deep")
        _check_tree(data)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


def _check_tree(value: Any) -> None:
    """PostgreSQL refuses NUL characters and lone surrogates in JSON text: say so
    as a 400 instead of failing in the database."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for k, v in item.items():
                _check_text(k)
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
