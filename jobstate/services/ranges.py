"""Single byte ranges (RFC 9110 section 14) for file downloads.

One range, or the whole file: a ``Range`` that is invalid, of another unit or of
several ranges is ignored, as the RFC allows (no ``multipart/byteranges``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import IO

from jobstate.exceptions import RangeNotSatisfiable

# int-range ("first-" or "first-last") or suffix-range ("-length"); ASCII digits
# only (``\d`` would take other scripts' digits).
_RANGE_SPEC = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")
_FAR = 10**18  # past the end of any file (and of int()'s 4300 digits)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``(first, last)`` positions of a ``size``-byte file that ``header`` asks
    for, or None for the whole file. Raises RangeNotSatisfiable for a valid range
    that selects no byte: one that starts at or past the end (any start on an
    empty file), or the last 0 bytes."""
    if header is None:
        return None
    unit, equals, range_set = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    specs = [spec.strip() for spec in range_set.split(",") if spec.strip()]  # 1#range-spec
    if len(specs) != 1:
        return None
    match = _RANGE_SPEC.fullmatch(specs[0])
    if match is None:
        return None
    first, last, suffix = match.groups()
    if suffix is not None:
        length = _position(suffix)
        if length == 0:
            raise RangeNotSatisfiable(size)
        if size == 0:
            # Satisfiable (RFC 9110 section 14.1.1), but no 206 can say "no bytes".
            return None
        return max(size - length, 0), size - 1
    start, end = _position(first), (_position(last) if last else _FAR)
    if end < start:
        return None  # invalid
    if start >= size:
        raise RangeNotSatisfiable(size)
    return start, min(end, size - 1)


def _position(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) < 19 else _FAR


def if_range_holds(if_range: str | None, etag: str) -> bool:
    """Whether a ``Range`` is to be honoured: no ``If-Range``, or one naming the
    file's strong ``etag``. A date, a weak or any other tag may name an older
    version: the whole file is sent."""
    return if_range is None or (bool(etag) and if_range.strip() == etag)


def read_span(file: IO[bytes], length: int, block_size: int) -> Iterator[bytes]:
    """``length`` bytes of ``file`` from its current position, ``block_size`` at a
    time (fewer if the file ends first)."""
    while length > 0:
        chunk = file.read(min(block_size, length))
        if not chunk:
            return
        length -= len(chunk)
        yield chunk
