"""A fake monotonic clock for the watchdog's decisions (tests/test_lease_margin.py,
tests/test_escalation.py)."""

from __future__ import annotations

from typing import Any

from jobstate.worker import slot as slot_module
from jobstate.worker import watchdog as watchdog_module


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def fake_clock(monkeypatch: Any) -> FakeClock:
    """The watchdog's and its slots' clock, replaced (a test's ``clock`` fixture)."""
    fake = FakeClock()
    monkeypatch.setattr(slot_module, "time", fake)
    monkeypatch.setattr(watchdog_module, "time", fake)
    return fake
