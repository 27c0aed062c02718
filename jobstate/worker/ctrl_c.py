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
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Defer a Ctrl-C until the block ends, then deliver it as it would have been
    (Python's own handler raises ``KeyboardInterrupt`` there), even if the block
    raised. A second Ctrl-C while one is held is delivered at once: the operator
    insists (the call may be stuck on a lock). Only in the main thread (the only
    one Python runs signal handlers in) and when SIGINT has a Python handler (a
    django-q2 worker process ignores it): elsewhere the block runs as it is."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    deliver = previous  # narrowed for the nested function
    pending: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            pending.clear()
            deliver(signum, frame)
        else:
            pending.append(frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            deliver(signal.SIGINT, pending.pop())
