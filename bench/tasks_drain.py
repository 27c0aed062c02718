"""Drain benchmark of the django.tasks backend: the same workload through
``@task`` + ``JobstateBackend`` versus jobstate's own handler API.

    .venv/bin/python bench/tasks_drain.py                        # 2,000 jobs x 3 rounds, PostgreSQL
    .venv/bin/python bench/tasks_drain.py --jobs 500 --database sqlite

Both modes run bench/jobs.py's workload (three progress updates, then a result):
``handler`` enqueues ``bench.drain`` jobs with ``services.enqueue``, ``task``
enqueues ``bench.tasks_drain_jobs.drain_task`` with ``.enqueue()``; each job is
enqueued on its own inside one transaction. One real ``manage.py qcluster``
(bench/tasks_drain_settings.py, 2 worker processes) runs every round; rounds
alternate between the modes. Drain throughput: jobs / (last ``finished_at`` -
commit). Enqueue: jobs/s of the enqueue loop. Prints each mode's median and the
task/handler ratio. ``--inline``: no cluster; this process drains each round with
``jobstate.worker.runner.drain`` (what a worker process runs per job).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--jobs", type=int, default=2000)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
parser.add_argument("--db", default="jobstate_bench_tasks")
parser.add_argument(
    "--inline",
    action="store_true",
    help="drain with jobstate.worker.runner.drain in this process instead of a qcluster "
    "(the per-job worker cost alone; far less sensitive to a loaded machine)",
)
ARGS = parser.parse_args()

if ARGS.database == "postgres":
    import psycopg

    with psycopg.connect(f"{ARGS.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [ARGS.db]).fetchone():
            conn.execute(f'CREATE DATABASE "{ARGS.db}"')
        conn.execute(f"ALTER DATABASE \"{ARGS.db}\" SET timezone TO 'UTC'")
    DATABASE_URL = f"{ARGS.pg.rstrip('/')}/{ARGS.db}"
else:
    DATABASE_URL = f"sqlite:///{Path(tempfile.gettempdir()) / (ARGS.db + '.sqlite3')}"
os.environ.update(
    DATABASE_URL=DATABASE_URL,
    DJANGO_SETTINGS_MODULE="bench.tasks_drain_settings",
    BENCH_MODE="jobstate",
    BENCH_WORKERS=str(ARGS.workers),
)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max  # noqa: E402

from bench.tasks_drain_jobs import drain_task  # noqa: E402
from jobstate import services  # noqa: E402
from jobstate.models import Job, JobEvent  # noqa: E402
from jobstate.states import TERMINAL  # noqa: E402


def reset() -> None:
    JobEvent.objects.all().delete()
    Job.objects.all().delete()


def enqueue(mode: str, n: int) -> float:
    started = time.perf_counter()
    with transaction.atomic():
        for i in range(n):
            if mode == "handler":
                services.enqueue("bench.drain", {"i": i})
            else:
                drain_task.enqueue(i)
    return time.perf_counter() - started


# --inline: CPU milliseconds per drained job of this process (on SQLite that includes the
# database's own work; far less sensitive than wall time to other load on the machine).
CPU: dict[str, list[float]] = {"handler": [], "task": []}


def round_(mode: str, n: int) -> tuple[float, float]:
    reset()
    enqueue_seconds = enqueue(mode, n)
    committed = time.time()
    if ARGS.inline:
        from jobstate.worker.runner import drain

        cpu = time.process_time()
        drain("bench-inline", max_jobs=n)
        CPU[mode].append((time.process_time() - cpu) / n * 1000)
    deadline = time.monotonic() + 1800
    while Job.objects.filter(status__in=TERMINAL).count() < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{mode}: not drained")
        time.sleep(0.2)
    failed = Job.objects.exclude(status="completed").count()
    if failed:
        raise SystemExit(f"{mode}: {failed} jobs did not complete")
    last = Job.objects.aggregate(last=Max("finished_at"))["last"].timestamp()
    return n / (last - committed), n / enqueue_seconds


def main() -> None:
    call_command("migrate", verbosity=0)
    reset()
    if ARGS.inline:
        measure()
        return
    log = Path(tempfile.mkstemp(prefix="bench-tasks-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "running." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"qcluster did not start:\n{log.read_text()}")
            time.sleep(0.1)
        measure()
    finally:
        import signal

        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.unlink(missing_ok=True)


def measure() -> None:
    results: dict[str, list[tuple[float, float]]] = {"handler": [], "task": []}
    for r in range(ARGS.rounds):
        for mode in ("handler", "task") if r % 2 == 0 else ("task", "handler"):
            results[mode].append(round_(mode, ARGS.jobs))
            drain, enq = results[mode][-1]
            print(f"round {r + 1} {mode:7}: drain {drain:7.1f} jobs/s, enqueue {enq:7.1f} jobs/s", flush=True)
    medians = {
        m: (statistics.median(d for d, _ in v), statistics.median(e for _, e in v))
        for m, v in results.items()
    }
    print(
        f"\n{ARGS.jobs} jobs x {ARGS.rounds} rounds, "
        f"{'inline drain' if ARGS.inline else f'{ARGS.workers} workers'}, {connection.vendor}, "
        f"Django {django.get_version()}, {os.cpu_count()} cores"
    )
    for mode, (drain, enq) in medians.items():
        print(f"{mode:7}: drain {drain:7.1f} jobs/s (median), enqueue {enq:7.1f} jobs/s")
    print(f"task/handler drain ratio: {medians['task'][0] / medians['handler'][0]:.3f}")
    if ARGS.inline:
        cpu = {m: statistics.median(v) for m, v in CPU.items()}
        print(
            f"drain CPU per job: handler {cpu['handler']:.2f} ms, task {cpu['task']:.2f} ms "
            f"(task/handler {cpu['task'] / cpu['handler']:.3f})"
        )
    print(f"task/handler enqueue ratio: {medians['task'][1] / medians['handler'][1]:.3f}")


if __name__ == "__main__":
    main()
