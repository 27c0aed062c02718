"""Workflow overhead benchmark (a script, not a test), in one process.

    .venv/bin/python bench/workflows.py                     # PostgreSQL
    .venv/bin/python bench/workflows.py --database sqlite

Measures, on a database of its own (``jobstate_bench_workflows``):

- steps: N jobs of a 10-step workflow whose steps do nothing, against N plain
  jobs reporting progress 10 times; time and SQL statements per step, and
  commits per step on PostgreSQL;
- checkpoints: one step iterating 20,000 items, checkpointing every 1 and
  every 100 items;
- fan-out: one step starting M child jobs (one transaction), then the
  children and the woken parent drained inline.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--jobs", type=int, default=200)
parser.add_argument("--children", type=int, default=1000)
parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
parser.add_argument("--db", default="jobstate_bench_workflows")
ARGS = parser.parse_args()

if ARGS.database == "postgres":
    import psycopg

    with psycopg.connect(f"{ARGS.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [ARGS.db]).fetchone():
            conn.execute(f'CREATE DATABASE "{ARGS.db}"')
    os.environ["DATABASE_URL"] = f"{ARGS.pg.rstrip('/')}/{ARGS.db}"
else:
    os.environ["DATABASE_URL"] = f"sqlite:///{Path(tempfile.gettempdir()) / (ARGS.db + '.sqlite3')}"
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import jobstate  # noqa: E402
from jobstate import services  # noqa: E402
from jobstate.models import Job, JobEvent, JobStep  # noqa: E402
from jobstate.worker.runner import drain  # noqa: E402

STEPS = 10


class Counter:
    def __init__(self) -> None:
        self.statements = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements += 1
        return execute(sql, params, many, context)


def commits() -> int:
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def measure(label: str, work: Any, per: int) -> dict[str, float]:
    counter = Counter()
    before = commits()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        work()
    elapsed = time.perf_counter() - started
    time.sleep(0.6)  # let PostgreSQL publish its statistics
    made = commits() - before
    row = {"ms": 1000 * elapsed / per, "sql": counter.statements / per, "commits": made / per}
    extra = f", {row['commits']:.1f} commits" if connection.vendor == "postgresql" else ""
    print(f"  {label:<34} {row['ms']:7.2f} ms, {row['sql']:5.1f} SQL statements{extra} per unit")
    return row


def reset() -> None:
    JobStep.objects.all().delete()
    JobEvent.objects.all().delete()
    Job.objects.all().delete()


Noop = type(
    "Noop", (jobstate.Workflow,), {f"s{i}": jobstate.step()(lambda self, ctx: None) for i in range(STEPS)}
)
jobstate.workflow("bench.steps", max_attempts=1)(Noop)


@jobstate.handler("bench.plain", max_attempts=1)
def plain(ctx: Any) -> None:
    for i in range(STEPS):
        ctx.progress(10 * i, f"s{i}", step=f"s{i}")


@jobstate.workflow("bench.iterate", max_attempts=1)
class Iterate(jobstate.Workflow):
    @jobstate.step()
    def walk(self, ctx: Any) -> None:
        for _ in ctx.iterate(range(20_000), every=ctx.parameters["every"]):
            pass


@jobstate.handler("bench.child", max_attempts=1)
def child(ctx: Any) -> int:
    return 1


@jobstate.workflow("bench.fan", max_attempts=1)
class Fan(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        for i in range(ctx.parameters["n"]):
            ctx.spawn("bench.child", {"i": i})

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> int:
        return split["completed"]


def main() -> None:
    call_command("migrate", verbosity=0)
    reset()
    print(f"{connection.vendor}, Django {django.get_version()}, Python {platform.python_version()}")
    n = ARGS.jobs
    print(f"{n} jobs x {STEPS} steps (per step):")
    services.enqueue_many([("bench.plain", {})] * n)
    plain_row = measure("plain handler, 10 progress calls", lambda: drain(max_jobs=n), n * STEPS)
    reset()
    services.enqueue_many([("bench.steps", {})] * n)
    wf_row = measure("workflow, 10 steps", lambda: drain(max_jobs=n), n * STEPS)
    print(f"  a workflow step costs {wf_row['ms'] - plain_row['ms']:.2f} ms more than a progress update")
    reset()
    print("one step over 20,000 items (per item):")
    for every in (1, 100):
        services.enqueue("bench.iterate", {"every": every})
        measure(f"checkpoint every {every}", lambda: drain(max_jobs=1), 20_000)
        reset()
    m = ARGS.children
    print(f"fan-out of {m} children:")
    parent = services.enqueue("bench.fan", {"n": m})
    started = time.perf_counter()
    drain(max_jobs=1)
    spawned = time.perf_counter() - started
    print(f"  parent run that starts them (one transaction): {spawned:.2f} s")
    started = time.perf_counter()
    ran = drain(max_jobs=m + 1)
    took = time.perf_counter() - started
    parent.refresh_from_db()
    assert parent.status == "completed" and parent.result == m, (parent.status, parent.result)
    rate = ran / took
    print(f"  {ran} jobs (children + the woken parent) drained inline in {took:.2f} s ({rate:.0f} jobs/s)")
    reset()


if __name__ == "__main__":
    main()
