"""Parameters a handler's serializer would ignore: keys it has no writable field for.

DRF drops such keys without a word, so a typo (``{"titel": "x"}``) enqueued a job
that ran with the default title. ``refused`` finds them, at every depth of nested
serializers (a field, a ``many=True`` list, a ``ListField`` or ``DictField`` of
one), in DRF's error shape, with the messages the REST API gives for a request
body's own unknown fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

UNKNOWN = "Unknown field."
READ_ONLY = "This field is read-only."

__all__ = ["READ_ONLY", "UNKNOWN", "merged", "printable", "refused"]


def refused(serializer: serializers.Serializer[Any], data: Any) -> dict[str, Any]:
    """The keys of ``data`` that ``serializer`` does not take, each with its message
    (a nested serializer's by its own key, a list item's by its index): empty when
    every key is taken. Values of the wrong type are left to the serializer."""
    if not isinstance(data, Mapping):
        return {}
    fields = serializer.fields
    errors: dict[str, Any] = {}
    for name, value in data.items():
        field = fields.get(name) if isinstance(name, str) else None
        # A HiddenField takes its value from its default, never from the input.
        if field is None or field.read_only or isinstance(field, serializers.HiddenField):
            errors[printable(name)] = [UNKNOWN if field is None else READ_ONLY]
            continue
        nested = _within(field, value)
        if nested:
            errors[name] = nested
    return errors


def merged(refused: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """``refused`` and the serializer's own ``errors`` (plain data, as
    ``InvalidParameters.errors``) in one tree: a key both name keeps both, the
    refusals first (a misspelt key is also why a required one is missing)."""
    out = dict(refused)
    for key, value in errors.items():
        mine = out.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            out[key] = merged(mine, value)
        elif isinstance(mine, list) and isinstance(value, list):
            out[key] = [*mine, *value]
        elif mine is None:
            out[key] = value
    return out


def _within(field: Any, value: Any) -> Any:
    """What ``field`` refuses inside ``value`` (None: nothing)."""
    if isinstance(field, serializers.ListSerializer | serializers.ListField):
        if not isinstance(value, list):
            return None
        items = {str(i): found for i, item in enumerate(value) if (found := _within(field.child, item))}
        return items or None
    if isinstance(field, serializers.DictField):
        if not isinstance(value, Mapping):
            return None
        entries = {str(k): found for k, item in value.items() if (found := _within(field.child, item))}
        return entries or None
    if isinstance(field, serializers.Serializer):
        return refused(field, value) or None
    return None


def printable(name: Any) -> str:
    """A key as an error can show it: a lone surrogate (valid in a JSON string)
    escaped, or the JSON renderer could not encode the response."""
    return str(name).encode("utf-8", "backslashreplace").decode("utf-8")
