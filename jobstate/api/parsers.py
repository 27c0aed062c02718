"""A JSON parser with a body size limit and no recursion surprises."""

from __future__ import annotations

import json
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from jobstate import conf
from jobstate.api.errors import PayloadTooLarge
from jobstate.storable import MAX_DEPTH, too_deep

# Room for a field that may hold MAX_DEPTH levels (parameters) inside the body.
BODY_MAX_DEPTH = 2 * MAX_DEPTH


class LimitedJSONParser(JSONParser):
    """DRF's JSONParser reads the whole body whatever its size (Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE only guards ``request.body``). This one reads
    at most ``API_MAX_BODY_BYTES`` (and never more than
    DATA_UPLOAD_MAX_MEMORY_SIZE) and answers 413 beyond it."""

    def parse(self, stream: IO[bytes], media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = max_body_bytes()
        request = (parser_context or {}).get("request")
        declared = _content_length(request)
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit}.")
        if stream is None:
            raise ParseError("Empty request body.")
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit} bytes.")
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        try:
            text = raw.decode(encoding)
            if too_deep(text, BODY_MAX_DEPTH):
                # Parsed, a body nested a little less deep than the parser's own
                # limit made a serializer's error message (repr of the value) a 500.
                raise ParseError(f"JSON parse error - nested more than {BODY_MAX_DEPTH} levels deep.")
            # Always strict (whatever REST_FRAMEWORK["STRICT_JSON"] says): PostgreSQL
            # refuses NaN and Infinity in JSON.
            return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply.") from None
        except (ValueError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def max_body_bytes() -> int:
    from django.conf import settings

    limit = int(conf.get("API_MAX_BODY_BYTES"))
    django_limit = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None)
    return min(limit, django_limit) if django_limit else limit


def _content_length(request: Any) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except (AttributeError, ValueError):
        return None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose names are unique. A repeated name was taken silently, the last
    one winning: a proxy or client library that reads the first (RFC 8259 leaves it
    open) saw another ``kind`` or parameters than the job that ran."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                # Escaped: a lone surrogate in the message made the response a 500.
                shown = key[:100].encode("utf-8", "backslashreplace").decode("utf-8")
                raise ValueError(f"duplicate key {shown!r}")
            seen.add(key)
    return obj
