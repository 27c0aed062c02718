"""How a loop that calls the database again and again (the pusher) logs a run of
failures: the first with its traceback, at ERROR; then, while the failures go on,
one line at most every ``REMIND_SECONDS``; and, once a call succeeds, that the
database answers again. A database down for an hour is then a few lines, not a
traceback every poll interval."""

from __future__ import annotations

import logging
import time

__all__ = ["QUIET_SECONDS", "REMIND_SECONDS", "Outage"]

REMIND_SECONDS = 60.0
# A failure this long after the last one starts a new run of failures.
QUIET_SECONDS = 600.0


class Outage:
    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what  # names the loop in every line ("jobstate broker")
        self.failures = 0
        self._since = self._logged = self._last = 0.0

    def failed(self, message: str, exc: BaseException) -> None:
        """Log a failure; ``message`` is the first one's (with ``exc``'s traceback).
        A failure more than ``QUIET_SECONDS`` after the last one starts a new run: a
        loop that calls rarely (a worker's chained claim) may not have called
        ``ended`` in between, though the database answered meanwhile."""
        now = time.monotonic()
        if self.failures and now - self._last > QUIET_SECONDS:
            self.failures = 0
        self._last = now
        self.failures += 1
        if self.failures == 1:
            self._since = self._logged = now
            self.logger.error("%s: %s", self.what, message, exc_info=exc)
        elif now - self._logged >= REMIND_SECONDS:
            self._logged = now
            self.logger.warning(
                "%s: the database still fails (%d attempts in %.0f s): %s: %s",
                self.what,
                self.failures,
                now - self._since,
                type(exc).__name__,
                exc,
            )

    def ended(self) -> None:
        """A call succeeded."""
        if self.failures:
            self.logger.info(
                "%s: the database answers again after %d failed attempts", self.what, self.failures
            )
            self.failures = 0
