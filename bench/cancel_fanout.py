"""Cancelling a fan-out (a script, not a test), in one process.

    .venv/bin/python bench/cancel_fanout.py                      # 10,000 children, PostgreSQL
    .venv/bin/python bench/cancel_fanout.py --database sqlite
    .venv/bin/python bench/cancel_fanout.py --children 2000 --running 50

A workflow's fan-out step starts N child jobs (one transaction, as in
production) and waits for them (status ``waiting``); ``--running`` of the
children are then claimed by a worker, the rest stay queued. The script times
``services.request_cancel(parent)``: every queued child cancelled and every
running one asked to cancel, each with a history row naming the parent, then
the parent cancelled. Before issue 10 each child's cancel was its own transition
that re-counted its active siblings (O(n^2)); the cascade (``services/cascade.py``)
does a fixed number of statements per 2,000 children. Prints seconds, SQL
statements, and checks the outcome. Uses a database of its own
(``jobstate_bench_cancel``), recreated on each run.
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
parser.add_argument("--children", type=int, default=10_000)
parser.add_argument("--running", type=int, default=100, help="children claimed by a worker before the cancel")
parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
parser.add_argument("--db", default="jobstate_bench_cancel")
ARGS = parser.parse_args()

if ARGS.database == "postgres":
    import psycopg

    with psycopg.connect(f"{ARGS.pg.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{ARGS.db}"')
        conn.execute(f'CREATE DATABASE "{ARGS.db}"')
    os.environ["DATABASE_URL"] = f"{ARGS.pg.rstrip('/')}/{ARGS.db}"
else:
    path = Path(tempfile.gettempdir()) / (ARGS.db + ".sqlite3")
    path.unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import jobstate  # noqa: E402
from jobstate import services  # noqa: E402
from jobstate.models import Job, JobEvent  # noqa: E402
from jobstate.states import Status  # noqa: E402
from jobstate.worker.runner import run_next  # noqa: E402


@jobstate.handler("bench.cancel_child", max_attempts=1)
def child(ctx: Any) -> None:
    return None


@jobstate.workflow("bench.cancel_fan", max_attempts=1)
class Fan(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        for i in range(ctx.parameters["n"]):
            ctx.spawn("bench.cancel_child", {"i": i})

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> None:
        return None


class Count:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.n += 1
        return execute(sql, params, many, context)


def main() -> None:
    call_command("migrate", verbosity=0)
    n = ARGS.children
    parent = services.enqueue("bench.cancel_fan", {"n": n})
    started = time.perf_counter()
    run_next("bench", kinds=["bench.cancel_fan"])  # starts the n children, then waits
    print(f"fan-out of {n} children started in {time.perf_counter() - started:.2f} s")
    parent.refresh_from_db()
    assert parent.status == Status.WAITING, parent.status
    running = services.claim("bench-worker", limit=ARGS.running, kinds=["bench.cancel_child"])
    count = Count()
    started = time.perf_counter()
    with connection.execute_wrapper(count):
        services.request_cancel(parent, "bench", "cancel the fan-out")
    took = time.perf_counter() - started

    children = Job.objects.filter(parent=parent)
    cancelled = children.filter(status=Status.CANCELLED).count()
    asked = children.filter(status=Status.PROCESSING, cancel_requested_at__isnull=False).count()
    naming = JobEvent.objects.filter(job__parent=parent, metadata__parent=str(parent.pk)).count()
    parent.refresh_from_db()
    assert parent.status == Status.CANCELLED, parent.status
    assert cancelled == n - len(running) and asked == len(running) and naming == n, (cancelled, asked, naming)
    print(
        f"{connection.vendor}, {platform.node()}, {os.cpu_count()} CPU: "
        f"cancelled a workflow with {n} children "
        f"({cancelled} queued -> cancelled, {asked} running -> cancel requested, {naming} history rows "
        f"naming the parent) in {took:.2f} s, {count.n} SQL statements"
    )


if __name__ == "__main__":
    main()
