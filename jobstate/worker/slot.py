"""The job a worker process runs now (``Slot``), as its heartbeat and watchdog
see it, and the call of its handler, which marks where an interrupt may land
(``HandlerCall``): only in the handler's own frames."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

from jobstate import conf
from jobstate.exceptions import Interrupted
from jobstate.worker.context import JobContext

# Raised in the main thread by the watchdog; its handler is installed by
# ``jobstate.worker.supervisor.install_signal``.
INTERRUPT_SIGNAL = signal.SIGUSR1


class Slot:
    """The job a worker process runs now, as its heartbeat and watchdog see it."""

    def __init__(
        self, ctx: JobContext, timeout: float, interruptible: bool, *, ends_process: bool = False
    ) -> None:
        now = time.monotonic()
        self.ctx = ctx
        self.deadline = now + timeout
        self.interruptible = interruptible
        # A django-q2 worker process (not an inline run): one whose handler does not
        # honour its interrupt ends (jobstate.worker.escalation).
        self.ends_process = ends_process
        self.main_ident = threading.get_ident()
        self.next_beat = now + float(conf.get("HEARTBEAT_SECONDS"))
        self.done = threading.Event()  # the handler has returned (or raised)
        self.interrupted: str | None = None  # why the watchdog interrupts it
        self.interrupted_at: float | None = None  # when (monotonic)
        self.delivered = False  # an Interrupted was raised inside the handler
        self.cancel_since: float | None = None
        self.call: HandlerCall | None = None
        # The heartbeat's last renewal waited on a lock instead of failing.
        self.blocked = False
        # Held while ``done`` is set, and by the escalation while it decides: the
        # handler either returned first or was given up first, never both.
        self.ending = threading.Lock()
        # Given up (the interrupt not honoured in time): the heartbeat renews it no
        # more; ``escalated`` is set once its outcome was recorded (``recorded``) or
        # the wait for that ran out (None).
        self.given_up = False
        self.escalated = threading.Event()
        self.recorded: str | None = None


class HandlerCall:
    """Calls the handler. Its frame marks where interrupts may land: only in
    frames it called (the handler and what the handler calls). Once the handler
    has returned, control is back in this frame or above, and a late interrupt
    is ignored instead of discarding the handler's result."""

    def __init__(self, func: Any, slot: Slot) -> None:
        self.func = func
        self.slot = slot
        self.entered = False

    def __call__(self, ctx: JobContext) -> Any:
        self.entered = True
        # An interrupt that came before this frame was ignored: honour it now.
        if self.slot.interrupted is not None:
            self.slot.delivered = True
            raise Interrupted(self.slot.interrupted)
        return self.func(ctx)

    def in_handler(self, frame: FrameType | None) -> bool:
        """Is ``frame`` (where a signal landed) inside the handler?"""
        depth = 0
        while frame is not None:
            if frame.f_code is _CALL_CODE:
                # In this frame itself the handler has either not been called
                # yet (interrupting is fine) or has returned (too late).
                return depth > 0 or not self.entered
            frame, depth = frame.f_back, depth + 1
        return False


_CALL_CODE = HandlerCall.__call__.__code__
