"""Primary keys of jobs and assets: UUID version 7 (RFC 9562), time-ordered.

A version 4 UUID is random, so each new job lands on a random leaf page of the
primary key index and of every index that leads with the job's id (the
history's ``(job, id)`` index, the assets' job index). On a table of a million
jobs those are thousands of pages, and after each checkpoint PostgreSQL logs the
whole of a page (8 KB) the first time it changes. A version 7 UUID starts with
its creation time in milliseconds, so new jobs go to the right-hand end of those
indexes, as with a sequence, and one checkpoint cycle touches a few pages of
each instead of most of them (``bench/ids.py`` measures both).

Within one millisecond the order follows a counter (RFC 9562 method 1, 12 bits)
so that ids made by one process also sort in creation order; the remaining 62
bits are random. An id carries its creation time, as ``created_at`` (which the
API shows) does: it is no secret and grants nothing (every lookup is scoped to
its owner).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_clock = time.time_ns  # nanoseconds since the epoch (tests replace it)


def _after_fork() -> None:
    # A fork while another thread held the lock would leave the child's copy held
    # forever. The child's ids stay unique: their 62 random bits are drawn anew.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def new_id() -> uuid.UUID:
    """A new version 7 UUID, later than every other this process made."""
    global _last_ms, _counter
    with _lock:
        ms = _clock() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            # Same millisecond (or the clock went back): keep the last one's time
            # and count on; a full counter borrows the next millisecond.
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    tail = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | tail
    return uuid.UUID(int=value)


def short(pk: object) -> str:
    """The few characters that tell jobs apart at a glance: the id's last 8 hex
    digits (a version 7 id begins with its creation time: its first 8 digits are
    the same for every job made in one window of 65.5 seconds; its end is random,
    as all of a version 4 id is)."""
    return str(pk)[-8:]


HEX = "0123456789abcdef"


def prefix_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids that begin with ``term`` (4 to 32 hex digits, dashes ignored) as a
    range an index serves; None when ``term`` is no such prefix."""
    hexed = term.replace("-", "").lower()
    if not 4 <= len(hexed) <= 32 or any(c not in HEX for c in hexed):
        return None
    return uuid.UUID(hexed.ljust(32, "0")), uuid.UUID(hexed.ljust(32, "f"))
