"""How long a job may run, and how long before its lease runs out a worker
process gives it up when its heartbeat cannot renew it."""

from __future__ import annotations

import math

from jobstate import conf
from jobstate.registry import HandlerSpec


def lease_margin() -> float:
    """How long before its lease runs out (on this process's clock) the watchdog
    gives a job up when the heartbeat cannot renew it: the reaper may requeue it
    from then on, and the interrupt takes a moment to land."""
    return float(conf.get("HEARTBEAT_SECONDS")) / 2


def timeout_for(spec: HandlerSpec | None) -> float:
    return float(spec.timeout if spec is not None and spec.timeout else conf.get("DEFAULT_TIMEOUT"))


def hard_limit_for(spec: HandlerSpec | None) -> int:
    """Seconds after which django-q2 kills the worker process outright."""
    margin = float(conf.get("HARD_KILL_MARGIN_SECONDS"))
    return math.ceil(timeout_for(spec) + float(conf.get("CANCEL_GRACE_SECONDS")) + margin)
