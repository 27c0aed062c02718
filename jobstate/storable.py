"""Values as both databases store them.

Text: PostgreSQL's text columns refuse a NUL character (SQLite keeps it), and
neither database takes a lone surrogate (a Python string may hold one: an
undecodable byte of a file name as ``os.fsdecode`` escapes it, say), which is not
UTF-8; so text a job reports (progress messages, error messages, tracebacks) has
each such character replaced by U+FFFD, the replacement character, instead of
failing the write.

JSON: ``json.dumps`` writes ``NaN`` and ``Infinity`` and a string may hold a NUL
character or a lone surrogate; PostgreSQL's ``jsonb`` refuses all three and
SQLite's ``JSON_VALID`` check refuses the first. A value that passed a Python
check and then failed at the database would surface as an IntegrityError or
DataError in the middle of a transition (a result that can never be stored would
be retried like a crash), so every JSON value a service stores goes through here
first.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import Error as DatabaseErrors

from jobstate import conf

# A NUL as json.dumps escapes it (ensure_ascii): ``\u0000`` after an even number
# of backslashes (an odd number would make it an escaped backslash and text).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A surrogate code point in a Python string (a character above U+FFFF is one code
# point, not a pair): not UTF-8, and so neither database's text.
_SURROGATE = re.compile("[\ud800-\udfff]")


# The deepest nesting of objects and lists stored. Deeper JSON is refused up front:
# encoding it again later, deeper in the call stack (Django's field does, as it
# saves), could hit Python's recursion limit in the middle of a write.
MAX_DEPTH = 100
# A JSON string, escapes included, and a container holding no other container.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_INNERMOST = re.compile(r"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")


def too_deep(encoded: str, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests objects and lists more than ``limit`` deep."""
    if encoded.count("[") + encoded.count("{") <= limit:
        return False  # the usual case, at the speed of str.count
    rest = _STRING.sub('""', encoded)
    for _ in range(limit):
        rest, found = _INNERMOST.subn("0", rest)
        if not found:
            return False
    return "[" in rest or "{" in rest


def json_text(value: Any, field: str) -> str:
    """``value`` as JSON text the database will accept, or ``ValidationError`` keyed by ``field``."""
    try:
        encoded = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError({field: [f"Not JSON-serialisable: {exception_text(exc)}"]}) from None
    except RecursionError:
        encoded = ""
    except DatabaseErrors:
        raise  # a query the value ran as it was read (say, a lost connection): not the value's fault
    except Exception as exc:
        # The value's own code raised as it was read (a mapping's items(), an
        # object's conversion): it cannot be stored as it is, any more than a set.
        detail = f"{type(exc).__name__}: {exception_text(exc)}"
        raise ValidationError({field: [f"Not JSON-serialisable: {detail}"]}) from None
    if not encoded or too_deep(encoded):
        raise ValidationError({field: [f"Not storable: nested more than {MAX_DEPTH} levels deep."]})
    if "\\u0000" in encoded and _NUL.search(encoded):
        raise ValidationError({field: ["Not storable: a string holds a NUL character (\\u0000)."]})
    if "\\ud" in encoded and _holds_a_surrogate(value, field):
        raise ValidationError({field: ["Not storable: a string holds a lone surrogate (not UTF-8)."]})
    return encoded


def _holds_a_surrogate(value: Any, field: str) -> bool:
    # Only asked when the escaped text shows one might be there (a pair, as
    # json.dumps escapes a character above U+FFFF, looks the same).
    try:
        json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    except DatabaseErrors:
        raise
    except Exception as exc:  # encoded once already: a value that changes as it is read
        raise ValidationError({field: [f"Not JSON-serialisable: {type(exc).__name__}"]}) from None
    return False


def json_value(value: Any, field: str) -> Any:
    """``value`` as the database will give it back (tuples as lists, dates as
    text, ...), or ``ValidationError`` keyed by ``field``."""
    return json.loads(json_text(value, field))


def result_value(value: Any, field: str) -> Any:
    """``json_value`` of a job's result or a step's output, also refused (a
    ``ValidationError``) over ``JOBSTATE["MAX_RESULT_BYTES"]`` of JSON."""
    encoded = json_text(value, field)
    limit = int(conf.get("MAX_RESULT_BYTES"))
    if len(encoded) > limit:  # bytes: json.dumps escapes every non-ASCII character
        raise ValidationError(
            {field: [f"Not storable: {len(encoded)} bytes of JSON, over MAX_RESULT_BYTES ({limit})."]}
        )
    return json.loads(encoded)


def text(value: str) -> str:
    """``value`` with each NUL character and lone surrogate replaced by U+FFFD."""
    value = str(value)  # a lazy translation, say
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if not value.isascii():
        value = _SURROGATE.sub("\ufffd", value)
    return value


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or, when its ``__str__`` raises, its ``repr``, or else
    ``<unprintable X>`` (as the traceback module does): an error being recorded
    must not be replaced by the error of printing it."""
    try:
        return str(exc)
    except Exception:
        pass
    try:
        return repr(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def clean_key(field: Any, value: Any) -> Any:
    """``value`` as the key ``field`` holds, or ``ValidationError`` if it is malformed or
    out of the column's range (which would fail inside the database: an OverflowError
    on SQLite, a DataError on PostgreSQL)."""
    key = field.to_python(value)
    field.run_validators(key)  # an integer field's validators hold the column's range
    return key
