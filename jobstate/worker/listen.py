"""Wake idle workers on PostgreSQL: LISTEN on the channel ``enqueue`` notifies.

``services.enqueue`` runs ``pg_notify('jobstate', kind)`` inside the enqueue
transaction, so the notification arrives when the job becomes visible. The
broker waits on a dedicated autocommit psycopg 3 connection for at most the
poll interval instead of sleeping; jobs that become ready by time alone
(``run_after``, retry backoff) are still found by that periodic poll.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from django.db import connections

logger = logging.getLogger("jobstate.worker")

CHANNEL = "jobstate"


class Listener:
    def __init__(self, alias: str = "default", channel: str = CHANNEL) -> None:
        self.alias = alias
        self.channel = channel
        self._conn: Any = None

    @staticmethod
    def available(alias: str = "default") -> bool:
        if connections[alias].vendor != "postgresql":
            return False
        try:
            import psycopg  # noqa: F401
        except ImportError:  # psycopg2: fall back to polling
            return False
        return True

    def _connect(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            params = connections[self.alias].get_connection_params()
            self._conn = psycopg.connect(**params, autocommit=True)
            self._conn.execute(f'LISTEN "{self.channel}"')
        return self._conn

    def wait(self, timeout: float) -> bool:
        """Block until a notification arrives (True) or ``timeout`` passes (False)."""
        try:
            conn = self._connect()
            for _notify in conn.notifies(timeout=timeout, stop_after=1):
                return True
            return False
        except Exception:
            logger.warning("jobstate listener: connection failed; polling instead", exc_info=True)
            self.close()
            time.sleep(timeout)
            return False

    def drain(self) -> int:
        """Listen (if not yet) and discard notifications already received: call it
        before a claim, which covers every job they announced."""
        try:
            return sum(1 for _ in self._connect().notifies(timeout=0))
        except Exception:
            logger.warning("jobstate listener: connection failed; polling instead", exc_info=True)
            self.close()
            return 0

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
