"""Drain benchmark: jobstate on django-q2 versus plain django-q2 (a script, not a test).

    .venv/bin/python bench/drain.py                 # 5,000 jobs, 2 workers, PostgreSQL
    .venv/bin/python bench/drain.py --jobs 1000 --modes jobstate
    .venv/bin/python bench/drain.py --database sqlite --modes jobstate

Each job makes three progress updates. jobstate records its full history
(enqueue, claim, complete events) and checks its lease; plain django-q2 updates
a row of its own (three progress updates, then "done"). For each mode the
script starts a real ``manage.py qcluster`` with 2 worker processes against a
database of its own (created here: ``jobstate_bench_drain``), then measures:

- pickup latency: jobs enqueued one by one at a steady rate into the idle
  cluster; enqueue commit -> handler start, p50 / p95;
- drain: N jobs enqueued in one transaction; jobs/s from that commit to the
  last job's end; database commits per job (``pg_stat_database.xact_commit``
  delta / N, read after the cluster stopped so every backend flushed its
  counters; it includes this script's own polling, about 4 per second).

Modes: ``jobstate`` (the Job table as django-q2's broker), ``plain``
(``async_task`` with django-q2's defaults on its ORM broker), ``tuned``
(``bulk`` 10, ``poll`` 0.05, ``save_limit`` 0), ``byid`` (jobstate jobs whose
id travels in a plain django-q2 message through the ORM broker, default
settings: the design that was not chosen). Also times ``enqueue_many`` of
10,000 jobs with their history rows.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000, help="jobs to drain per mode (default 5000)")
    parser.add_argument("--latency-jobs", type=int, default=100, help="jobs for the pickup latency phase")
    parser.add_argument("--rate", type=float, default=10.0, help="enqueue rate of the latency phase (jobs/s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--modes", default="jobstate,plain,tuned", help="comma list: jobstate,plain,tuned,byid"
    )
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server URL")
    parser.add_argument("--db", default="jobstate_bench_drain", help="benchmark database name")
    parser.add_argument("--conn-max-age", type=int, default=0, help="CONN_MAX_AGE for every process")
    parser.add_argument(
        "--enqueue-many", type=int, default=10000, help="size of the enqueue_many timing (0: skip)"
    )
    return parser.parse_args()


ARGS = parse()
if ARGS.database == "postgres":
    DATABASE_URL = f"{ARGS.pg.rstrip('/')}/{ARGS.db}"
else:
    DATABASE_URL = f"sqlite:///{Path(tempfile.gettempdir()) / (ARGS.db + '.sqlite3')}"
os.environ.update(
    DATABASE_URL=DATABASE_URL,
    DJANGO_SETTINGS_MODULE="bench.settings",
    BENCH_CONN_MAX_AGE=str(ARGS.conn_max_age),
    BENCH_WORKERS=str(ARGS.workers),
)


def create_database() -> None:
    if ARGS.database != "postgres":
        return
    import psycopg

    with psycopg.connect(f"{ARGS.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [ARGS.db]).fetchone():
            conn.execute(f'CREATE DATABASE "{ARGS.db}"')
        # Django sets the session time zone on every new connection unless the
        # server's already matches; both systems reconnect per task (CONN_MAX_AGE=0).
        conn.execute(f"ALTER DATABASE \"{ARGS.db}\" SET timezone TO 'UTC'")


create_database()

import django  # noqa: E402

django.setup()
logging.getLogger("django-q").setLevel(logging.WARNING)  # the clusters log to their own files

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django_q.models import OrmQ, Success, Task  # noqa: E402
from django_q.tasks import async_task  # noqa: E402

from bench.tasks import SCHEMA, TABLE  # noqa: E402
from jobstate import services  # noqa: E402
from jobstate.models import Job  # noqa: E402
from jobstate.states import Status  # noqa: E402

POSTGRES = connection.vendor == "postgresql"


def reset() -> None:
    with connection.cursor() as cursor:
        if POSTGRES:
            cursor.execute(
                "TRUNCATE jobstate_job, jobstate_jobevent, jobstate_asset, django_q_ormq, django_q_task, "
                f"{TABLE} RESTART IDENTITY CASCADE"
            )
        else:
            for table in (
                "jobstate_jobevent",
                "jobstate_asset",
                "jobstate_job",
                "django_q_ormq",
                "django_q_task",
            ):
                cursor.execute(f"DELETE FROM {table}")
        if POSTGRES:
            cursor.execute(
                f"VACUUM ANALYZE jobstate_job, jobstate_jobevent, django_q_ormq, django_q_task, {TABLE}"
            )


def commits() -> int:
    if not POSTGRES:
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class Cluster:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.log = Path(tempfile.mkstemp(prefix=f"bench-{mode}-", suffix=".log")[1])
        # byid: jobstate jobs announced by plain django-q2 messages, default settings.
        env = dict(os.environ, BENCH_MODE="plain" if mode == "byid" else mode, PYTHONUNBUFFERED="1")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "running." not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"qcluster for {mode} did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        time.sleep(0.5)  # exiting backends flush their statistics

    def errors(self) -> int:
        text = self.log.read_text(errors="replace")
        return text.count("database is locked") + text.count("Traceback")


# -- the two workloads -------------------------------------------------------


def enqueue_one(mode: str, i: int) -> None:
    if mode == "jobstate":
        services.enqueue("bench.drain", {"i": i})
    elif mode == "byid":
        with transaction.atomic():
            job = services.enqueue("bench.drain", {"i": i})
            async_task("jobstate.worker.tasks.run_by_id", str(job.pk))
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {TABLE} (enqueued) VALUES (%s) RETURNING id", [time.time()])
            async_task("bench.tasks.plain_job", cursor.fetchone()[0])


def enqueue_batch(mode: str, n: int) -> None:
    if mode == "jobstate":
        services.enqueue_many([("bench.drain", {"i": i}) for i in range(n)])
        return
    with transaction.atomic():
        if mode == "byid":
            for job in services.enqueue_many([("bench.drain", {"i": i}) for i in range(n)]):
                async_task("jobstate.worker.tasks.run_by_id", str(job.pk))
            return
        with connection.cursor() as cursor:
            now = time.time()
            cursor.execute(
                f"INSERT INTO {TABLE} (enqueued) SELECT %s FROM generate_series(1, %s) RETURNING id", [now, n]
            )
            for (row_id,) in cursor.fetchall():
                async_task("bench.tasks.plain_job", row_id)


def done(mode: str) -> int:
    if mode in ("jobstate", "byid"):
        return Job.objects.filter(status__in=[Status.COMPLETED, Status.FAILED]).count()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")
        return int(cursor.fetchone()[0])


def timings(mode: str) -> tuple[list[float], float]:
    """(pickup latencies in seconds, time the last job ended)."""
    if mode in ("jobstate", "byid"):
        rows = list(Job.objects.values_list("created_at", "result", "finished_at"))
        latencies = [r["started"] - created.timestamp() for created, r, _f in rows if r]
        return latencies, max(f.timestamp() for _c, _r, f in rows)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT started - enqueued, finished FROM {TABLE}")
        rows = cursor.fetchall()
    return [r[0] for r in rows], max(r[1] for r in rows)


def wait_done(mode: str, n: int, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while done(mode) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{mode}: only {done(mode)} of {n} jobs done after {timeout} s")
        time.sleep(0.25)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def run(mode: str) -> dict[str, Any]:
    reset()
    cluster = Cluster(mode)
    try:
        # Pickup latency: a steady trickle into an idle cluster.
        gap = 1 / ARGS.rate
        for i in range(ARGS.latency_jobs):
            started = time.monotonic()
            enqueue_one(mode, i)
            time.sleep(max(0.0, gap - (time.monotonic() - started)))
        wait_done(mode, ARGS.latency_jobs)
        latencies, _ = timings(mode)
        time.sleep(1)
        reset()

        # Drain: N jobs in one transaction.
        before = commits()
        t_enqueue = time.monotonic()
        enqueue_batch(mode, ARGS.jobs)
        enqueued_at = time.time()
        enqueue_seconds = time.monotonic() - t_enqueue
        wait_done(mode, ARGS.jobs)
        _, last_end = timings(mode)
    finally:
        cluster.stop()
    after = commits()
    seconds = last_end - enqueued_at
    return {
        "mode": mode,
        "jobs_per_s": ARGS.jobs / seconds,
        "seconds": seconds,
        "enqueue_s": enqueue_seconds,
        "commits_per_job": (after - before) / ARGS.jobs if POSTGRES else float("nan"),
        "p50_ms": pct(latencies, 50),
        "p95_ms": pct(latencies, 95),
        "errors": cluster.errors(),
        "failed_tasks": Task.objects.filter(success=False).count(),
        "saved_successes": Success.objects.count(),
        "left_in_queue": OrmQ.objects.count(),
    }


def time_enqueue_many(n: int) -> list[float]:
    reset()
    runs = []
    for _ in range(3):
        items = [("bench.drain", {"i": i}) for i in range(n)]
        started = time.perf_counter()
        services.enqueue_many(items)
        runs.append(time.perf_counter() - started)
        reset()
    return runs


LABELS = {
    "jobstate": "jobstate (Job table as broker)",
    "plain": "plain django-q2, defaults",
    "tuned": "plain django-q2, tuned",
    "byid": "jobstate, id-only messages (ORM broker)",
}


def machine() -> str:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in meminfo if line.startswith("MemTotal")), 0)
    db = connection.vendor
    if POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            db = f"PostgreSQL {cursor.fetchone()[0]} (local, default config)"
    return (
        f"{os.cpu_count()} cores, {mem} GB RAM, {db}, Python {platform.python_version()}, "
        f"Django {django.get_version()}, CONN_MAX_AGE={ARGS.conn_max_age}, {ARGS.workers} worker processes"
    )


def main() -> None:
    call_command("migrate", verbosity=0)
    if POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute(SCHEMA)
    modes = [m.strip() for m in ARGS.modes.split(",") if m.strip()]
    if not POSTGRES and set(modes) - {"jobstate"}:
        raise SystemExit("on SQLite only the jobstate mode runs (plain modes use PostgreSQL SQL)")
    results = []
    for mode in modes:
        print(f"running {mode} ...", flush=True)
        results.append(run(mode))
        r = results[-1]
        print(
            f"  {r['jobs_per_s']:.0f} jobs/s, {r['commits_per_job']:.2f} commits/job, "
            f"pickup p50 {r['p50_ms']:.0f} ms p95 {r['p95_ms']:.0f} ms, errors in log: {r['errors']}",
            flush=True,
        )

    print(f"\nMachine: {machine()}; {ARGS.jobs} jobs, 3 progress updates each.\n")
    print("| mode | jobs/s | commits/job | pickup p50 | pickup p95 | drain time |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {LABELS[r['mode']]} | {r['jobs_per_s']:.0f} | {r['commits_per_job']:.1f} | "
            f"{r['p50_ms']:.0f} ms | {r['p95_ms']:.0f} ms | {r['seconds']:.1f} s |"
        )
    by_mode = {r["mode"]: r for r in results}
    if "jobstate" in by_mode:
        for other in ("plain", "tuned", "byid"):
            if other in by_mode:
                ratio = by_mode["jobstate"]["jobs_per_s"] / by_mode[other]["jobs_per_s"]
                print(f"\njobstate / {LABELS[other]}: {ratio:.1f}x")
    for r in results:
        if r["errors"] or r["failed_tasks"] or r["left_in_queue"]:
            print(
                f"NOTE {r['mode']}: {r['errors']} errors in the cluster log, {r['failed_tasks']} failed "
                f"tasks, {r['left_in_queue']} left in django-q2's queue"
            )
    if ARGS.enqueue_many:
        runs = time_enqueue_many(ARGS.enqueue_many)
        print(
            f"\nenqueue_many({ARGS.enqueue_many}) with history rows: "
            f"best {min(runs):.2f} s, median {statistics.median(runs):.2f} s ({len(runs)} runs)"
        )
    reset()


if __name__ == "__main__":
    main()
