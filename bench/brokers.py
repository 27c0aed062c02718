"""The jobstate broker with its claims timed (bench/drain.py ``--clusters``):
each claim's duration in seconds, appended to ``BENCH_CLAIM_LOG``."""

from __future__ import annotations

import os
import time
from typing import Any

from jobstate.worker.broker import JobBroker


class TimedBroker(JobBroker):
    _log: Any = None

    def _claim(self, kinds: list[str], limit: int) -> list[Any]:
        started = time.perf_counter()
        jobs = super()._claim(kinds, limit)
        if TimedBroker._log is None:
            TimedBroker._log = open(os.environ["BENCH_CLAIM_LOG"], "a", buffering=1)  # noqa: SIM115
        TimedBroker._log.write(f"{time.perf_counter() - started:.6f}\n")
        return jobs
