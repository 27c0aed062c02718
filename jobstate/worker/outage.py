"""How a loop that calls the database again and again (the pusher) logs a run of
failures: the first with its traceback, at ERROR; then, while the failures go on,
one line at most every ``REMIND_SECONDS``; and, once a call succeeds, that the
database answers again. A database down for an hour is then a few lines, not a
traceback every poll interval."""

from __future__ import annotations

import logging
import time

__all__ = ["REMIND_SECONDS", "Outage"]

REMIND_SECONDS = 60.0


class Outage:
    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what  # names the loop in every line ("jobstate broker")
        self.failures = 0
        self._since = self._logged = 0.0

    def failed(self, message: str, exc: BaseException) -> None:
        """Log a failure; ``message`` is the first one's (with ``exc``'s traceback)."""
        now = time.monotonic()
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
