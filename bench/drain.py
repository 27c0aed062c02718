"""Drain benchmark: jobstate against the other ways to run jobs from Django (a script, not a test).

    .venv/bin/python bench/drain.py                       # 5,000 jobs, 2 rounds, every system
    .venv/bin/python bench/drain.py --jobs 1000 --rounds 1 --systems jobstate,sql10
    .venv/bin/python bench/drain.py --clusters 1,2,4 --systems jobstate
    .venv/bin/python bench/drain.py --database sqlite     # jobstate on SQLite

One run, one workload for every system: N jobs enqueued first (each system's
bulk API where it has one), each job writes 3 progress updates then ends, 2
worker processes, the same connection settings (``CONN_MAX_AGE=None``,
``DEBUG=False`` and ``OPTIONS={"prepare_threshold": 5}`` for every Django-based
system: Django's ORM binds parameters client-side and prepares nothing,
jobstate prepares its own hot statements; persistent psycopg connections,
which prepare repeated statements by default, for the others).
Systems (``--systems``):

- ``jobstate``: the Job table as django-q2's broker, every progress call written
  (``PROGRESS_FLUSH_SECONDS=0``); ``jobstate-flush``: the default coalescing;
  ``jobstate-noprep``: every call written, without prepared statements
  (``prepare_threshold`` unset, Django's default);
- ``q2``, ``q2tuned``: plain django-q2 ``async_task`` on its ORM broker,
  defaults, and ``bulk`` 10, ``poll`` 0.05, ``save_limit`` 0;
- ``procrastinate``: its Django contrib, best of 2 workers x concurrency 1 and
  1 worker x concurrency 2 (both are printed);
- ``tasksdb``: Django 6.1's tasks framework with django-tasks-db's ``db_worker``
  (2 processes, defaults), run under the Django 6 venv (``--django6-python``);
- ``celery``: Celery 5 with Redis (``--redis``), prefork, concurrency 2;
- ``sql1``, ``sql10``: a framework-free psycopg loop claiming 1 or 10 rows with
  ``FOR UPDATE SKIP LOCKED``, with history rows (the ceiling).

The peers update a row of their own per job (``bench_plain_job``); jobstate and
the bare-SQL loop also keep a lease and history rows. Per system and round:

- pickup latency: ``--latency-jobs`` jobs enqueued one by one at ``--rate``
  into the idle workers; enqueue -> task start, p50 / p95;
- drain: jobs/s from the enqueue commit to the last job's end; commits per job
  (``pg_stat_database.xact_commit``, read after the workers stopped, minus this
  script's own statements); WAL bytes per job (``pg_current_wal_lsn()`` delta,
  server-wide: run on a quiet server, see ``--own-server``; with
  ``BENCH_WAL_RANGE=1`` each drain prints its LSN range for ``pg_waldump``,
  e.g. ``--stats=record``, to see which records make it); worker CPU ms per
  job (user + system time of every process the system started, pusher,
  sentinel and monitor included, the database server excluded); database
  CPU ms per job (``--own-server`` only: every server process, the backends
  that exited included; the enqueue included, as for WAL). A checkpoint that
  falls inside a drain is noted under the table.

Each figure is the median of ``--rounds`` rounds. ``--clusters 1,2,4`` runs
jobstate with that many qclusters (2 workers each) against one database and
reports the p95 time of a claim. Also times ``enqueue_many`` of 10,000 jobs
with their history rows. Peers (bench/requirements.txt) are benchmark-only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ALL = "jobstate,jobstate-flush,jobstate-noprep,sql10,sql1,celery,procrastinate,tasksdb,q2tuned,q2"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000, help="jobs to drain per system and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each figure is their median")
    parser.add_argument("--latency-jobs", type=int, default=100, help="jobs of the pickup latency phase")
    parser.add_argument("--rate", type=float, default=10.0, help="enqueue rate of the latency phase (jobs/s)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--systems", default=ALL, help=f"comma list of: {ALL}")
    parser.add_argument(
        "--clusters", default="", help="jobstate only: comma list of qcluster counts, e.g. 1,2,4"
    )
    parser.add_argument(
        "--progress-flush", type=float, default=None, help="PROGRESS_FLUSH_SECONDS of jobstate-flush"
    )
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server URL")
    parser.add_argument(
        "--own-server",
        type=int,
        default=0,
        metavar="PORT",
        help="initdb and start a private PostgreSQL (default config, but no checkpoint during "
        "the run) on PORT so that no other client's WAL or commits are counted; removed at the end",
    )
    parser.add_argument(
        "--db",
        default="jobstate_bench_drain",
        help="benchmark database name (dropped and created afresh by each run)",
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--django6-python", default="/work/main/.venv-django6/bin/python")
    parser.add_argument(
        "--enqueue-many", type=int, default=10000, help="size of the enqueue_many timing (0: skip)"
    )
    parser.add_argument(
        "--schema-sql",
        default="",
        metavar="FILE",
        help="PostgreSQL: run this SQL on the benchmark database after migrating, to measure a "
        "schema change before writing its migration (bench/experiments/ has those measured)",
    )
    return parser.parse_args()


ARGS = parse()


class OwnServer:
    """A throwaway PostgreSQL cluster (default configuration, fsync and synchronous
    commit on), with no checkpoint while the benchmark runs."""

    def __init__(self, port: int) -> None:
        bindir = Path("/usr/lib/postgresql")
        versions = sorted(bindir.glob("*/bin/initdb"))
        if not versions:
            raise SystemExit("--own-server: no initdb under /usr/lib/postgresql")
        self.bin = versions[-1].parent
        self.dir = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        self.port = port
        user = [] if os.geteuid() else ["runuser", "-u", "postgres", "--"]
        if user:
            shutil.chown(self.dir, "postgres")
        self.user = user
        subprocess.run(
            [
                *user,
                str(self.bin / "initdb"),
                "-D",
                str(self.dir / "data"),
                "-U",
                "postgres",
                "--auth",
                "trust",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                *user,
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.dir / "data"),
                "-o",
                f"-p {port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                # No checkpoint inside a drain: at the default 5 minutes one lands on
                # whichever system runs then (its CPU, its writes, and the full-page
                # images after it). Durability (fsync, synchronous_commit) is unchanged.
                "-c checkpoint_timeout=1h -c max_wal_size=20GB",
                "-l",
                str(self.dir / "log"),
                "-w",
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def cpu_seconds(self) -> float:
        """User + system CPU of the postmaster and its children (each server
        process has a session of its own), and of the backends that exited."""
        postmaster = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster or int(stat.parent.name) == postmaster:
                total += sum(int(x) for x in fields[11:15]) / tick
        return total

    def stop(self) -> None:
        subprocess.run(
            [*self.user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop"],
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


SERVER = OwnServer(ARGS.own_server) if ARGS.own_server and ARGS.database == "postgres" else None
PG = f"postgres://postgres@127.0.0.1:{ARGS.own_server}" if SERVER else ARGS.pg.rstrip("/")
if ARGS.database == "postgres":
    DATABASE_URL = f"{PG}/{ARGS.db}"
else:
    DATABASE_URL = f"sqlite:///{Path(tempfile.gettempdir()) / (ARGS.db + '.sqlite3')}"
ORCHESTRATOR_MODE = "jobstate"
if ARGS.database == "postgres":
    try:
        import procrastinate  # noqa: F401

        ORCHESTRATOR_MODE = "procrastinate"  # its app must be installed here to defer
    except ImportError:
        pass
os.environ.update(
    DATABASE_URL=DATABASE_URL,
    DJANGO_SETTINGS_MODULE="bench.settings",
    BENCH_CONN_MAX_AGE="none",
    BENCH_WORKERS=str(ARGS.workers),
    BENCH_MODE=ORCHESTRATOR_MODE,
)


def create_database() -> None:
    if ARGS.database != "postgres":
        Path(DATABASE_URL.removeprefix("sqlite:///")).unlink(missing_ok=True)
        return
    import psycopg

    # Afresh each run: a --schema-sql experiment of an earlier run must not stay in the
    # schema that a later run measures as jobstate's own.
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{ARGS.db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{ARGS.db}"')
        conn.execute(f"ALTER DATABASE \"{ARGS.db}\" SET timezone TO 'UTC'")


create_database()

import django  # noqa: E402

django.setup()
logging.getLogger("django-q").setLevel(logging.WARNING)

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.peers import sql as bare_sql  # noqa: E402
from bench.tasks import SCHEMA, TABLE  # noqa: E402
from jobstate import services  # noqa: E402
from jobstate.models import Job  # noqa: E402
from jobstate.states import Status  # noqa: E402

POSTGRES = connection.vendor == "postgresql"


# -- measuring ------------------------------------------------------------------


class Meter:
    """This script's own statements on a connection of its own, so they can be
    taken out of the commit count."""

    def __init__(self) -> None:
        self.statements = 0
        self.conn: Any = None
        if POSTGRES:
            import psycopg

            self.conn = psycopg.connect(DATABASE_URL, autocommit=True)

    def one(self, sql: str, params: Any = None) -> Any:
        if self.conn is None:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchone()
        self.statements += 1
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Any = None) -> list[Any]:
        if self.conn is None:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall()
        self.statements += 1
        return self.conn.execute(sql, params).fetchall()

    def commits(self) -> int:
        self.one("SELECT pg_stat_clear_snapshot()")
        return int(self.one("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0])

    def wal(self) -> int:
        return int(self.one("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0])

    def checkpoints(self) -> int:
        self.one("SELECT pg_stat_clear_snapshot()")
        return int(self.one("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")[0])

    def hot(self) -> tuple[int, int]:
        row = self.one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobstate_job'"
        )
        return (int(row[0]), int(row[1])) if row else (0, 0)


METER: Meter


def cpu_seconds(sessions: set[int]) -> float:
    """User + system CPU of every live process in these sessions (each system's
    processes run in sessions of their own) and of the children they reaped."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state ppid pgrp session ... utime stime cutime cstime.
        # cutime/cstime hold the CPU of children that exited and were waited for
        # (django-q2 recycles its worker processes every ``recycle`` tasks).
        if int(fields[3]) in sessions:
            total += sum(int(x) for x in fields[11:15]) / tick
    return total


def rss_mb(sessions: set[int]) -> float:
    """Resident memory of every live process in these sessions (MB)."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            pid = int(status.parent.name)
            if os.getsid(pid) not in sessions:
                continue
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        total += int(line.split()[1])
    return total / 1024


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


# -- the systems ------------------------------------------------------------------


class Procs:
    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = Path(tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".log")[1])
        self.logs.append(log)
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def sessions(self) -> set[int]:
        return {p.pid for p in self.procs}

    def check(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                raise SystemExit(
                    f"{self.name}: a worker process exited:\n{log.read_text(errors='replace')[-3000:]}"
                )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        time.sleep(0.5)  # exiting backends flush their statistics

    def errors(self) -> int:
        text = "".join(log.read_text(errors="replace") for log in self.logs)
        return text.count("database is locked") + text.count("Traceback")


class System:
    """Plain peers: one ``bench_plain_job`` row per job, updated by the task."""

    label = ""
    table = TABLE

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs = Procs(name)
        self.claim_log: Path | None = None

    def start(self) -> None:
        raise NotImplementedError

    def enqueue_rows(self, n: int) -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {self.table} (enqueued) SELECT %s FROM generate_series(1, %s) RETURNING id",
                [time.time(), n],
            )
            return [r[0] for r in cursor.fetchall()]

    def defer(self, ids: list[int]) -> None:
        raise NotImplementedError

    def enqueue(self, n: int) -> float | None:
        """Enqueue n jobs; the commit time if it is not the return time."""
        with transaction.atomic():
            self.defer(self.enqueue_rows(n))
        return None

    def enqueue_drain(self, n: int) -> float | None:
        """Enqueue the drain's n jobs; the time the drain starts if it is not the
        return time."""
        return self.enqueue(n)

    def latency_phase(self, n: int, rate: float) -> None:
        for _ in range(n):
            started = time.monotonic()
            self.enqueue(1)
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))

    def done(self) -> int:
        return int(METER.one(f"SELECT count(*) FROM {self.table} WHERE status = 'completed'")[0])

    def timings(self) -> tuple[list[float], float]:
        rows = METER.all(f"SELECT started - enqueued, finished FROM {self.table}")
        return [r[0] for r in rows], max(r[1] for r in rows)

    def reset(self) -> None:
        wanted = [
            "jobstate_jobevent",
            "jobstate_job",
            "django_q_ormq",
            "django_q_task",
            TABLE,
            "bench_sql_event",
            "bench_sql_job",
            "procrastinate_events",
            "procrastinate_jobs",
            "django_tasks_db_dbtaskresult",
        ]
        with connection.cursor() as cursor:
            if not POSTGRES:
                for t in wanted[:4]:
                    cursor.execute(f"DELETE FROM {t}")
                return
            cursor.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY(%s)",
                [wanted],
            )
            tables = ", ".join(r[0] for r in cursor.fetchall())
            cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
            cursor.execute(f"VACUUM ANALYZE {tables}")


class Jobstate(System):
    table = "jobstate_job"

    def __init__(self, name: str, clusters: int = 1, flush: float | None = 0.0, prepare: bool = True) -> None:
        super().__init__(name)
        self.clusters = clusters
        self.flush = flush
        self.prepare = prepare
        if clusters > 1:
            self.label = f"jobstate, {clusters} qclusters x {ARGS.workers} workers"
        elif not prepare:
            self.label = "jobstate (every progress call written, no prepared statements)"
        elif flush == 0.0:
            self.label = "jobstate (every progress call written)"
        else:
            self.label = f"jobstate (progress flush {'default' if flush is None else flush})"

    def start(self) -> None:
        settings: dict[str, Any] = {}
        if self.flush is not None:
            settings["PROGRESS_FLUSH_SECONDS"] = self.flush
        self.claim_log = Path(tempfile.mkstemp(prefix="bench-claims-")[1])
        env = {
            "BENCH_MODE": "jobstate",
            "BENCH_JOBSTATE": json.dumps(settings),
            "BENCH_BROKER": "bench.brokers.TimedBroker",
            "BENCH_CLAIM_LOG": str(self.claim_log),
        }
        if not self.prepare:
            env["BENCH_NO_PREPARE"] = "1"
        for _ in range(self.clusters):
            self.procs.start([sys.executable, "manage.py", "qcluster"], env)

    def enqueue(self, n: int) -> float | None:
        services.enqueue_many([("bench.drain", {"i": i}) for i in range(n)])
        return None

    def done(self) -> int:
        return int(
            METER.one(
                "SELECT count(*) FROM jobstate_job WHERE status IN (%s, %s)",
                [Status.COMPLETED, Status.FAILED],
            )[0]
        )

    def timings(self) -> tuple[list[float], float]:
        rows = list(Job.objects.values_list("created_at", "result", "finished_at"))
        latencies = [r["started"] - created.timestamp() for created, r, _f in rows if r]
        return latencies, max(f.timestamp() for _c, _r, f in rows if f)


class Q2(System):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.label = (
            "django-q2, defaults" if name == "q2" else "django-q2, tuned (bulk 10, poll 0.05, save_limit 0)"
        )

    def start(self) -> None:
        self.procs.start([sys.executable, "manage.py", "qcluster"], {"BENCH_MODE": self.name})

    def defer(self, ids: list[int]) -> None:
        from django_q.tasks import async_task

        for row_id in ids:  # django-q2 has no bulk enqueue
            async_task("bench.tasks.plain_job", row_id)


class Procrastinate(System):
    def __init__(self, name: str, processes: int, concurrency: int) -> None:
        super().__init__(name)
        self.processes, self.concurrency = processes, concurrency
        self.label = (
            f"procrastinate, {processes} worker{'s' if processes > 1 else ''} x concurrency {concurrency}"
        )

    def start(self) -> None:
        for _ in range(self.processes):
            self.procs.start(
                [
                    sys.executable,
                    "manage.py",
                    "procrastinate",
                    "worker",
                    "--concurrency",
                    str(self.concurrency),
                ],
                {"BENCH_MODE": "procrastinate"},
            )

    def defer(self, ids: list[int]) -> None:
        from bench.procrastinate_tasks import plain_job

        plain_job.batch_defer(*({"row_id": i} for i in ids))


class TasksDB(System):
    label = "django-tasks-db (Django 6.1 tasks, db_worker x 2)"

    def env(self) -> dict[str, str]:
        return {"DJANGO_SETTINGS_MODULE": "bench.settings_tasksdb"}

    def start(self) -> None:
        for _ in range(ARGS.workers):
            self.procs.start([ARGS.django6_python, "manage.py", "db_worker"], self.env())

    def _driver(self, n: int, rate: float = 0.0) -> str:
        return subprocess.run(
            [ARGS.django6_python, "-m", "bench.tasksdb_tasks", str(n), str(rate)],
            cwd=ROOT,
            env={**os.environ, **self.env()},
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def enqueue(self, n: int) -> float | None:
        # The commit time, not this call's end: the interpreter's start and exit are not the drain's.
        out = self._driver(n)
        return float(out.split("committed ")[1].split()[0]) if "committed " in out else None

    def latency_phase(self, n: int, rate: float) -> None:
        self._driver(n, rate)


class Celery(System):
    label = "Celery 5 + Redis (prefork, concurrency 2)"

    def start(self) -> None:
        import redis

        redis.Redis.from_url(ARGS.redis).flushdb()
        self.procs.start(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.peers.celery_app",
                "worker",
                "--pool",
                "prefork",
                "-c",
                str(ARGS.workers),
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--prefetch-multiplier",
                "4",
            ],
            {"BENCH_REDIS": ARGS.redis, "BENCH_DSN": DATABASE_URL},
        )

    def defer(self, ids: list[int]) -> None:
        from bench.peers.celery_app import plain_job

        def send() -> None:
            for row_id in ids:  # Celery has no bulk publish; one pipeline-less send each
                plain_job.delay(row_id)

        transaction.on_commit(send)

    def enqueue_drain(self, n: int) -> float | None:
        """Celery publishes one message per job (after the commit) and its workers take
        each as it arrives, so a drain timed from the end of publishing would leave out
        the jobs run meanwhile. Its workers stop consuming while the jobs are published,
        as the others' see none of them before their commit; the drain starts when they
        consume again."""
        from bench.peers.celery_app import app

        paused = app.control.cancel_consumer("celery", reply=True, limit=1, timeout=5)
        if len(paused) != 1:
            raise SystemExit(f"Celery: the worker did not stop consuming ({paused})")
        self.enqueue(n)
        started = time.time()
        resumed = app.control.add_consumer("celery", reply=True, limit=1, timeout=5)
        if len(resumed) != 1:
            raise SystemExit(f"Celery: the worker did not consume again ({resumed})")
        return started


class BareSQL(System):
    table = "bench_sql_job"

    def __init__(self, name: str, claim: int) -> None:
        super().__init__(name)
        self.claim = claim
        self.label = f"framework-free SQL, claim {claim} (ceiling)"

    def start(self) -> None:
        for _ in range(ARGS.workers):
            self.procs.start(
                [sys.executable, "-m", "bench.peers.sql", "--dsn", DATABASE_URL, "--claim", str(self.claim)]
            )

    def enqueue(self, n: int) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute(bare_sql.ENQUEUE, [time.time(), n])
        return None


def make(name: str) -> list[Callable[[], System]]:
    """Factories: every round starts from a fresh system."""
    if name == "jobstate":
        return [lambda: Jobstate(name)]
    if name == "jobstate-flush":
        return [lambda: Jobstate(name, flush=ARGS.progress_flush)]
    if name == "jobstate-noprep":
        return [lambda: Jobstate(name, prepare=False)]
    if name in ("q2", "q2tuned"):
        return [lambda: Q2(name)]
    if name == "procrastinate":
        return [
            lambda: Procrastinate("procrastinate-2x1", 2, 1),
            lambda: Procrastinate("procrastinate-1x2", 1, 2),
        ]
    if name == "tasksdb":
        return [lambda: TasksDB(name)]
    if name == "celery":
        return [lambda: Celery(name)]
    if name in ("sql1", "sql10"):
        return [lambda: BareSQL(name, int(name[3:]))]
    raise SystemExit(f"unknown system {name!r}")


def wait_done(system: System, n: int, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while system.done() < n:
        system.procs.check()
        if time.monotonic() > deadline:
            raise SystemExit(f"{system.name}: only {system.done()} of {n} jobs done after {timeout} s")
        time.sleep(0.25)


def claim_times(system: System) -> list[float]:
    if system.claim_log is None or not system.claim_log.exists():
        return []
    return [float(x) for x in system.claim_log.read_text().split()]


def run(system: System) -> dict[str, Any]:
    system.reset()
    system.start()
    try:
        # Warm up (imports, connections), then pickup latency into idle workers.
        # A system may still record a job's end after the task wrote its row.
        system.enqueue(4)
        wait_done(system, 4, timeout=120)
        time.sleep(1)
        system.reset()
        system.latency_phase(ARGS.latency_jobs, ARGS.rate)
        wait_done(system, ARGS.latency_jobs)
        latencies, _ = system.timings()
        time.sleep(1)
        system.reset()
        if system.claim_log is not None:
            system.claim_log.write_text("")

        # Drain: N jobs enqueued at once.
        cpu_before = cpu_seconds(system.procs.sessions())
        db_cpu_before = SERVER.cpu_seconds() if SERVER else 0.0
        rss_before = rss_mb(system.procs.sessions())
        commits_before, wal_before, hot_before = (
            (METER.commits(), METER.wal(), METER.hot()) if POSTGRES else (0, 0, (0, 0))
        )
        checkpoints_before = METER.checkpoints() if POSTGRES else 0
        own_before = METER.statements
        t0 = time.monotonic()
        enqueued_at = system.enqueue_drain(ARGS.jobs) or time.time()
        enqueue_s = time.monotonic() - t0
        wait_done(system, ARGS.jobs)
        cpu = cpu_seconds(system.procs.sessions()) - cpu_before
        db_cpu = SERVER.cpu_seconds() - db_cpu_before if SERVER else float("nan")
        rss_after = rss_mb(system.procs.sessions())
        _, last_end = system.timings()
        wal_after = METER.wal() if POSTGRES else 0
        if os.environ.get("BENCH_WAL_RANGE") and POSTGRES:
            start, end = METER.one("SELECT pg_lsn '0/0' + %s, pg_lsn '0/0' + %s", [wal_before, wal_after])
            print(f"  WAL of the drain: pg_waldump --stats=record -s {start} -e {end}", flush=True)
        errors_before_stop = system.procs.errors()
        checkpoints = METER.checkpoints() - checkpoints_before if POSTGRES else 0
    finally:
        system.procs.stop()
    own = METER.statements - own_before
    commits = METER.commits() - commits_before - own if POSTGRES else 0
    hot = METER.hot() if POSTGRES else (0, 0)
    updates = hot[0] - hot_before[0]
    claims = claim_times(system)
    seconds = last_end - enqueued_at
    return {
        "jobs_per_s": ARGS.jobs / seconds,
        "seconds": seconds,
        "enqueue_s": enqueue_s,
        "commits": commits / ARGS.jobs if POSTGRES else float("nan"),
        "wal": (wal_after - wal_before) / ARGS.jobs if POSTGRES else float("nan"),
        "cpu_ms": cpu * 1000 / ARGS.jobs,
        "db_cpu_ms": db_cpu * 1000 / ARGS.jobs,
        "p50": pct(latencies, 50),
        "p95": pct(latencies, 95),
        "hot": (hot[1] - hot_before[1]) / updates * 100 if updates else float("nan"),
        "claim_p95": pct(claims, 95) if claims else float("nan"),
        "rss_before": rss_before,
        "rss_after": rss_after,
        "errors": errors_before_stop,
        "checkpoints": checkpoints,
    }


def median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def machine() -> str:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in meminfo if line.startswith("MemTotal")), 0)
    db = "SQLite"
    if POSTGRES:
        version = METER.one("SHOW server_version")[0]
        sync = METER.one("SHOW synchronous_commit")[0]
        fsync = METER.one("SHOW fsync")[0]
        where = "private server" if SERVER else "shared server"
        checkpoint = METER.one("SHOW checkpoint_timeout")[0]
        max_wal = METER.one("SHOW max_wal_size")[0]
        db = (
            f"PostgreSQL {version} ({where}, fsync {fsync}, synchronous_commit {sync}, "
            f"checkpoint_timeout {checkpoint}, max_wal_size {max_wal})"
        )
    return (
        f"{os.cpu_count()} cores, {mem} GB RAM, {db}, Python {platform.python_version()}, "
        f"Django {django.get_version()}, CONN_MAX_AGE=None, {ARGS.workers} worker processes"
    )


def fmt(value: float, spec: str) -> str:
    return "n/a" if value != value else format(value, spec)  # NaN


def table(results: list[tuple[System, dict[str, Any]]], reference: dict[str, Any] | None) -> None:
    print(
        "| system | jobs/s | vs jobstate | commits/job | WAL bytes/job | worker CPU ms/job "
        "| database CPU ms/job | pickup p50/p95 ms | HOT % | claim p95 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for system, r in sorted(results, key=lambda sr: -sr[1]["jobs_per_s"]):
        ratio = r["jobs_per_s"] / reference["jobs_per_s"] if reference else float("nan")
        times = f"{ratio:.2f}x" if ratio == ratio else "n/a"
        print(
            f"| {system.label} | {r['jobs_per_s']:.0f} | {times} | {fmt(r['commits'], '.1f')} "
            f"| {fmt(r['wal'], ',.0f')} | {r['cpu_ms']:.1f} | {fmt(r['db_cpu_ms'], '.1f')} "
            f"| {r['p50']:.0f}/{r['p95']:.0f} "
            f"| {fmt(r['hot'], '.0f') if isinstance(system, Jobstate) else '-'} "
            f"| {fmt(r['claim_p95'], '.1f') if isinstance(system, Jobstate) else '-'} |"
        )


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_enqueue_many(n: int) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds of this process plus its PostgreSQL backend) per
    run: on a loaded machine the CPU time tells what the wall time would be on
    an idle one (less the commit's fsync)."""
    System("reset").reset()
    backend = 0
    if POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
    runs = []
    for _ in range(3):
        items = [("bench.drain", {"i": i}) for i in range(n)]
        cpu = time.process_time() + (proc_cpu(backend) if backend else 0.0)
        started = time.perf_counter()
        services.enqueue_many(items)
        wall = time.perf_counter() - started
        runs.append((wall, time.process_time() + (proc_cpu(backend) if backend else 0.0) - cpu))
        System("reset").reset()
    return runs


def migrate(names: list[str]) -> None:
    call_command("migrate", verbosity=0)
    if POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute(SCHEMA)
            cursor.execute(bare_sql.SCHEMA)
            if ARGS.schema_sql:
                cursor.execute(Path(ARGS.schema_sql).read_text())
    if "tasksdb" in names and Path(ARGS.django6_python).exists():
        subprocess.run(
            [ARGS.django6_python, "manage.py", "migrate", "-v0"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings_tasksdb"},
            check=True,
        )


def main() -> None:
    global METER
    names = [n.strip() for n in ARGS.systems.split(",") if n.strip()]
    if not POSTGRES and set(names) - {"jobstate", "jobstate-flush", "jobstate-noprep"}:
        names = [n for n in names if n.startswith("jobstate")]
        print("SQLite: only jobstate runs (the peers need PostgreSQL or a server)")
    migrate(names)
    METER = Meter()
    factories: list[Callable[[], System]] = []
    skipped: list[str] = []
    for name in names:
        if name == "tasksdb" and not Path(ARGS.django6_python).exists():
            skipped.append(f"tasksdb: no Django 6 interpreter at {ARGS.django6_python}")
            continue
        factories.extend(make(name))
    counts = [int(c) for c in ARGS.clusters.split(",") if c.strip()]
    if counts:
        factories = [lambda c=c: Jobstate(f"jobstate-{c}c", clusters=c) for c in counts]
    results: list[tuple[System, dict[str, Any]]] = []
    for factory in factories:
        rounds = []
        for i in range(ARGS.rounds):
            system = factory()
            print(f"running {system.label}, round {i + 1} ...", flush=True)
            r = run(system)
            print("  " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
            rounds.append(r)
        results.append((system, median(rounds)))

    # procrastinate: the table keeps the better of its two configurations.
    procrastinate = [sr for sr in results if isinstance(sr[0], Procrastinate)]
    if len(procrastinate) > 1:
        worst = min(procrastinate, key=lambda sr: sr[1]["jobs_per_s"])
        print(f"\n{worst[0].label}: {worst[1]['jobs_per_s']:.0f} jobs/s (the table keeps the better one)")
        results.remove(worst)
    reference = next((r for s, r in results if s.name in ("jobstate", "jobstate-1c")), None)
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; {ARGS.jobs} jobs, "
        f"3 progress writes each, medians of {ARGS.rounds} round(s).\n"
    )
    table(results, reference)
    print()
    for system, r in results:
        growth = (r["rss_after"] / r["rss_before"] - 1) * 100 if r["rss_before"] else float("nan")
        print(
            f"{system.label}: worker RSS {r['rss_before']:.0f} MB before the drain, "
            f"{r['rss_after']:.0f} MB after ({growth:+.1f}%)"
        )
    for line in skipped:
        print(f"\nskipped {line}")
    for system, r in results:
        if r["errors"]:
            print(f"NOTE {system.label}: {r['errors']:.0f} errors in its log")
        if r["checkpoints"]:
            print(f"NOTE {system.label}: a checkpoint fell inside its drain (median of rounds)")
    if ARGS.enqueue_many and not counts:
        runs = time_enqueue_many(ARGS.enqueue_many)
        walls, cpus = [w for w, _c in runs], [c for _w, c in runs]
        print(
            f"\nenqueue_many({ARGS.enqueue_many}) with history rows: wall best {min(walls):.2f} s, "
            f"median {statistics.median(walls):.2f} s; CPU (this process + its database backend) "
            f"best {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s ({len(runs)} runs)"
        )


if __name__ == "__main__":
    try:
        main()
    finally:
        if SERVER is not None:
            SERVER.stop()
