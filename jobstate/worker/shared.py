"""Memory shared by the processes of one django-q2 cluster: a counter and a set
of process ids, created in the sentinel before it forks the pusher and the
worker processes (without ``fork`` they are off and count nothing).

Workers are disposable: one may be killed (SIGKILL) at any instant, also while
it updates these. A plain ``multiprocessing`` lock would then stay held for
good, and every process that touches the counters, the pusher first, would
wait on it forever. So reads take no lock (one aligned integer, or a slot at a
time), and the lock that serialises writes records its holder: a process that
has waited ``TAKEOVER_SECONDS`` for it and finds the holder gone takes it over.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Counter", "Slots", "running"]

# How long a write waits for the lock before it looks at the holder (a live
# holder keeps it for microseconds; a loaded machine may deschedule it a while),
# and after how long it takes the lock over whoever holds it (a dead holder's pid
# may have been given to a new process meanwhile).
TAKEOVER_SECONDS = 0.5
TAKEOVER_MAX_SECONDS = 5.0


def _fork() -> Any:
    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


class _Guard:
    """A lock between processes that survives its holder's death."""

    def __init__(self, ctx: Any) -> None:
        self._lock = ctx.Lock()
        self._holder = ctx.RawValue("i", 0)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        unknown = 0  # timeouts with no holder recorded (killed between taking and recording)
        since = time.monotonic()
        while not self._lock.acquire(timeout=TAKEOVER_SECONDS):
            holder = self._holder.value
            unknown = unknown + 1 if holder == 0 else 0
            gone = (holder and not running(holder)) or unknown >= 2
            if gone or time.monotonic() - since >= TAKEOVER_MAX_SECONDS:
                if self._holder.value != holder:
                    continue  # another waiter took it over first, and someone holds it now
                self._holder.value = 0
                # The dead holder's lock, released on its behalf (a semaphore: any
                # process may). Should it release late after all, that is one
                # count lost, which the broker's reconciliation corrects.
                with contextlib.suppress(ValueError):
                    self._lock.release()
                since = time.monotonic()
        self._holder.value = os.getpid()
        try:
            yield
        finally:
            self._holder.value = 0
            with contextlib.suppress(ValueError):  # taken over meanwhile and released
                self._lock.release()


class Counter:
    """An integer in shared memory, never below zero (see ``jobstate.worker.counters``)."""

    def __init__(self) -> None:
        ctx = _fork()
        self.value: Any = ctx.RawValue("i", 0) if ctx else None
        self._guard = _Guard(ctx) if ctx else None

    @property
    def shared(self) -> bool:
        return self.value is not None

    def add(self, n: int) -> None:
        if self.value is not None and self._guard is not None:
            with self._guard.held():
                # Never below zero: after a correction (lower_to) the packages
                # still queued are picked up without having been counted.
                self.value.value = max(0, self.value.value + n)

    def get(self) -> int:
        return int(self.value.value) if self.value is not None else 0

    def lower_to(self, n: int) -> None:
        if self.value is not None and self._guard is not None:
            with self._guard.held():
                self.value.value = min(self.value.value, n)


class Slots:
    """Process ids in shared memory, one slot each: who is inside ``execute``
    right now. A slot whose process is gone (killed, or recycled without
    leaving) is cleared by ``forget_dead``."""

    def __init__(self, size: int) -> None:
        ctx = _fork()
        self.pids: Any = ctx.RawArray("i", size) if ctx else None
        self._guard = _Guard(ctx) if ctx else None

    @property
    def shared(self) -> bool:
        return self.pids is not None

    def enter(self, pid: int) -> None:
        if self.pids is None or self._guard is None:
            return
        with self._guard.held():
            for i, held in enumerate(self.pids):
                if held == 0:
                    self.pids[i] = pid
                    return

    def leave(self, pid: int) -> None:
        if self.pids is None or self._guard is None:
            return
        with self._guard.held():
            for i, held in enumerate(self.pids):
                if held == pid:
                    self.pids[i] = 0
                    return

    def count(self) -> int:
        if self.pids is None:
            return 0
        return sum(1 for held in self.pids if held)

    def forget_dead(self) -> int:
        """Clear the slots of processes that no longer run; returns how many."""
        if self.pids is None or self._guard is None:
            return 0
        cleared = 0
        with self._guard.held():
            for i, held in enumerate(self.pids):
                if held and not running(held):
                    self.pids[i] = 0
                    cleared += 1
        return cleared


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed worker its
    sentinel has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True
