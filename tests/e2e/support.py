"""Helpers for end-to-end tests that run a real ``python manage.py qcluster``.

The cluster runs with ``project.test_settings`` against the pytest test
database (a file on SQLite, ``test_<name>`` on PostgreSQL), so tests that use
it must be transactional (``@pytest.mark.django_db(transaction=True)``): the
workers only see committed rows. Leases, heartbeats and the reaper are made
short through ``JOBSTATE_OVERRIDES`` (read by the test settings).

Reuse: request the ``qcluster`` fixture (tests/e2e/conftest.py) and call it to
start a cluster; every cluster it started is stopped, and its whole process
group killed, when the test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# Short enough that rescue happens within seconds, long enough that a loaded
# CI machine does not lose leases of healthy workers.
FAST_JOBSTATE: dict[str, Any] = {
    "LEASE_SECONDS": 2,
    "HEARTBEAT_SECONDS": 0.4,
    "REAP_INTERVAL_SECONDS": 0.5,
    "CANCEL_GRACE_SECONDS": 2,
    "HARD_KILL_MARGIN_SECONDS": 1,
    "RETRY_JITTER": 0,
}
FAST_Q_CLUSTER: dict[str, Any] = {"poll": 0.1, "guard_cycle": 0.25, "workers": 2}


def wait_for(
    predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.05, message: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s: {message or predicate} (last: {last!r})")
        time.sleep(interval)


def database_url() -> str:
    """A DATABASE_URL pointing a subprocess at the current (test) database."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    if connection.vendor == "postgresql":
        auth = quote(s.get("USER") or "", safe="")
        if s.get("PASSWORD"):
            auth += ":" + quote(s["PASSWORD"], safe="")
        host = s.get("HOST") or "127.0.0.1"
        port = s.get("PORT") or 5432
        return f"postgres://{auth}@{host}:{port}/{s['NAME']}"
    raise RuntimeError(f"no end-to-end support for {connection.vendor}")


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def group_pids(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def worker_pid(worker_id: str) -> int:
    """The worker process pid in a ``<host>:<qcluster pid>:<worker pid>`` id."""
    parts = worker_id.split(":")
    if len(parts) < 3:
        raise ValueError(f"{worker_id!r} names a cluster, not a worker process")
    return int(parts[-1])


class QCluster:
    """One ``manage.py qcluster`` subprocess in its own session/process group."""

    def __init__(
        self,
        *,
        jobstate: dict[str, Any] | None = None,
        q_cluster: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        media_root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.jobstate = {**FAST_JOBSTATE, **(jobstate or {})}
        self.q_cluster = {**FAST_Q_CLUSTER, **(q_cluster or {})}
        self.extra_env = env or {}
        self.media_root = media_root
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="qcluster-", suffix=".log")[1])

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            DJANGO_SETTINGS_MODULE="project.test_settings",
            DATABASE_URL=database_url(),
            JOBSTATE_OVERRIDES=json.dumps(self.jobstate),
            Q_CLUSTER_OVERRIDES=json.dumps(self.q_cluster),
            JOBSTATE_LOG="INFO",
            PYTHONUNBUFFERED="1",
        )
        if self.media_root is not None:
            env["JOBSTATE_MEDIA_ROOT"] = str(self.media_root)
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 30.0) -> QCluster:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"qcluster exited with {self.proc.returncode}:\n{self.log()}")
            return self.log().count("ready for work") >= int(self.q_cluster["workers"]) and (
                "running." in self.log()
            )

        wait_for(ready, timeout, 0.05, "qcluster to start")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pids(self) -> list[int]:
        """Every live process of this cluster (main, sentinel, pusher, monitor, workers)."""
        return group_pids(self.pid) if self.proc is not None else []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal one of this cluster's processes (refuses any other pid)."""
        if pid not in self.pids():
            raise AssertionError(f"pid {pid} is not a process of this cluster ({self.pids()})")
        os.kill(pid, sig)

    def stop(self, timeout: float = 8.0, *, graceful: bool = True) -> None:
        """SIGTERM (graceful: workers finish what they hold), then SIGKILL the group.
        ``graceful=False`` kills at once (teardown: whatever ran is discarded)."""
        if self.proc is None:
            return
        try:
            if graceful and self.proc.poll() is None:
                for pid in self.pids():  # resume anything a test stopped
                    os.kill(pid, signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.wait(5)
            deadline = time.monotonic() + 5
            while group_pids(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def cleanup(self) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)
