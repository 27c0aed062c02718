"""Holding an operator's Ctrl-C (SIGINT) across a step that must not be cut short.

An inline run (``runner.run_next``) claims a job in one database call: a
``KeyboardInterrupt`` raised inside it, after the claim committed, would leave
the job ``processing`` under a lease token nobody knows (the reaper's, once the
lease expires). Held, the Ctrl-C lands once the call has returned, where the
caller knows what it claimed and can hand it back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class _Hold:
    """The SIGINT handler while a Ctrl-C is held: the first press is kept for
    ``deliver`` (the handler it replaced), a second one is delivered at once."""

    def __init__(self, deliver: Callable[[int, FrameType | None], Any]) -> None:
        self.deliver = deliver
        self.pending: list[FrameType | None] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.pending:
            self.pending.clear()
            self.deliver(signum, frame)
        else:
            self.pending.append(frame)


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Defer a Ctrl-C until the block ends, then deliver it as it would have been
    (Python's own handler raises ``KeyboardInterrupt`` there), even if the block
    raised. A second Ctrl-C while one is held is delivered at once: the operator
    insists (the call may be stuck on a lock). Only in the main thread (the only
    one Python runs signal handlers in) and when SIGINT has a Python handler (a
    django-q2 worker process ignores it): elsewhere the block runs as it is, and
    so does a block inside another held one (the outer one holds it, and a second
    press still lands at once)."""
    previous = signal.getsignal(signal.SIGINT)
    if (
        threading.current_thread() is not threading.main_thread()
        or not callable(previous)
        or isinstance(previous, _Hold)
    ):
        yield
        return
    hold = _Hold(previous)
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if hold.pending:
            previous(signal.SIGINT, hold.pending.pop())
