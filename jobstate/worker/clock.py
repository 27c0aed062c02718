"""How far this process's clock is from the database's (PostgreSQL).

On PostgreSQL leases are written and judged by the database's clock
(``LeaseClock``), but the times a process records (``started_at``, history
rows, a retry's ``run_after``) come from its own clock, so a clock that
disagrees moves them. The process beat
(``services.workers.beat``, every ``HEARTBEAT_SECONDS``, off the job path)
returns the database's ``STATEMENT_TIMESTAMP()`` from the statement it runs
anyway; this process's clock, read just before and just after the call,
brackets that moment: the offset is taken at the midpoint and is known within
half the round trip. The next beat stores it on the process's row (the admin's
list shows it). SQLite (one machine) measures nothing.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from jobstate import conf

logger = logging.getLogger("jobstate")

# This process's clock, the one ``timezone.now()`` reads (tests replace it).
wall = time.time


def limit() -> float:
    """The largest offset (seconds) let pass without a warning: a quarter of
    ``HEARTBEAT_SECONDS``, half of the margin by which the watchdog gives up a
    lease it cannot renew before it runs out (``limits.lease_margin``)."""
    return float(conf.get("HEARTBEAT_SECONDS")) / 4


def past_limit(offset: float | None) -> bool:
    return offset is not None and abs(offset) > limit()


RISKS = {
    "behind": (
        "the times it records (start and end of jobs, their history) are that much early and "
        "the retries it schedules run that much sooner (its leases are timed by the database)"
    ),
    "ahead": (
        "the times it records (start and end of jobs, their history) are that much late and "
        "the retries it schedules wait that much longer (its leases are timed by the database)"
    ),
}


class ClockWatch:
    """The latest offset of this process's clock from the database's, and what
    was last said about it (one warning per change of side, not one per beat)."""

    def __init__(self) -> None:
        # Seconds this clock is ahead of the database's (negative: behind); None
        # until measured.
        self.offset: float | None = None
        self.side = ""  # "", "ahead" or "behind": the side last warned of

    def measured(self, before: float, database: datetime | None, after: float, name: str) -> None:
        """Take one reading: ``database`` is the database's clock at some moment
        between ``before`` and ``after`` (this clock, around the call); None
        (SQLite, a first beat) tells nothing."""
        if database is None:
            return
        error = abs(after - before) / 2
        bound = limit()
        if error > bound / 2:
            return  # a round trip this slow cannot tell a bad clock from a good one
        offset = before + (after - before) / 2 - database.timestamp()
        self.offset = offset
        if abs(offset) - error > bound:
            side = "ahead" if offset > 0 else "behind"
            if side != self.side:
                self.side = side
                logger.warning(
                    "jobstate: the clock of process %s is %.2f s %s the database's (within %.2f s; "
                    "more than the %.2f s allowed, a quarter of HEARTBEAT_SECONDS): %s. "
                    "Synchronise the machine's clock (NTP).",
                    name,
                    abs(offset),
                    "ahead of" if side == "ahead" else "behind",
                    error,
                    bound,
                    RISKS[side],
                )
        elif self.side and abs(offset) + error <= bound / 2:
            # Back well within the limit (not just under it: a clock that hovers
            # at the limit would warn at every other beat).
            self.side = ""
            logger.info(
                "jobstate: the clock of process %s agrees with the database's again (%+.2f s)", name, offset
            )
