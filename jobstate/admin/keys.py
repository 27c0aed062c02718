"""Ids from a query string or a form, checked before they reach a query.

A malformed id or one out of the column's range would otherwise fail inside the
database (an OverflowError on SQLite, a DataError on PostgreSQL): a 500.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Field

from jobstate.storable import clean_key


def valid_keys(field: Field[Any, Any], values: list[str]) -> list[str]:
    """The values that are well-formed ids for ``field``."""
    kept = []
    for value in values:
        try:
            clean_key(field, value)
        except ValidationError:
            continue
        kept.append(value)
    return kept
