"""Server-side latency of the REST API on a large PostgreSQL database.

    python bench/api.py                       # seeds jobstate_bench (1,000,000 jobs) if needed
    python bench/api.py --jobs 100000 --repeat 100 --explain

Each request goes through Django's whole stack in-process (middleware, token
authentication, view, serialization; no network), timed with
``time.perf_counter``, after a warm-up. Scenarios, as a regular owner (1/50 of
the jobs) and as staff (all of them):

- list, first page (50 jobs, newest first)
- list, filtered page (status + kind)
- list, deep page: the ``next`` link followed 50 times (2,500 rows in), and a
  cursor near the owner's oldest job
- detail of a job (including its steps)

Prints p50 / p95 / max wall-clock milliseconds, the median CPU time this
process spent per request (Django's share; PostgreSQL runs in its own process)
and the SQL queries per request; with ``--explain`` also the plan of each list
query (EXPLAIN ANALYZE). Wall-clock figures include any wait for a CPU, so run
it on an otherwise idle machine (the load average is printed at the end).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.seed import DEFAULT_DB, DEFAULT_SERVER, ensure

TARGET_MS = 50.0


def cursor_for(created_at: Any, pk: Any) -> str:
    """A cursor positioned at a job, in the API's default ordering."""
    payload = {"o": "-created_at", "v": [created_at.isoformat(), str(pk)]}
    return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")


def measure(get: Callable[[], Any], repeat: int, warmup: int = 10) -> tuple[list[float], list[float]]:
    """Wall-clock and this process's CPU time per request, in milliseconds."""
    for _ in range(warmup):
        get()
    times, cpu = [], []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        response = get()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
        assert response.status_code == 200, (response.status_code, response.content[:300])
    return times, cpu


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description="REST API latency on a large database.")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs to seed if the database is empty")
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--db", default=DEFAULT_DB)
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--repeat", type=int, default=300, help="timed requests per scenario")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of each list query")
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    args = parser.parse_args()

    ensure(args.jobs, args.owners, server=args.server, db=args.db)

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    from jobstate.models import Job

    users = get_user_model().objects
    owner = users.get(username="bench_user_01")
    staff, _ = users.get_or_create(username="bench_staff", defaults={"is_staff": True, "is_superuser": True})
    clients = {}
    for who, user in (("owner", owner), ("staff", staff)):
        token, _ = Token.objects.get_or_create(user=user)
        clients[who] = Client(HTTP_AUTHORIZATION=f"Token {token.key}")

    owned = Job.objects.filter(owner=owner)
    total, mine = Job.objects.count(), owned.count()
    oldest = owned.order_by("created_at", "id").values_list("created_at", "id")[100]
    detail_ids = list(owned.filter(kind="etl.import").values_list("id", flat=True)[:100]) + list(
        owned.exclude(kind="etl.import").values_list("id", flat=True)[:100]
    )

    def deep_link(client: Any, hops: int = 50) -> str:
        url = "/api/jobs/"
        for _ in range(hops):
            url = client.get(url).json()["next"]
        return url.split("testserver", 1)[-1]

    detail_cycle = iter(range(10**9))

    def detail(client: Any) -> Callable[[], Any]:
        return lambda: client.get(f"/api/jobs/{detail_ids[next(detail_cycle) % len(detail_ids)]}/")

    deepest = f"/api/jobs/?cursor={cursor_for(*oldest)}"
    scenarios: list[tuple[str, str, Callable[[], Any]]] = []
    for who, client in clients.items():
        deep = deep_link(client)
        scenarios += [
            (who, "list, first page", lambda c=client: c.get("/api/jobs/")),
            (who, "list, status=failed&kind=report.export", lambda c=client: c.get(
                "/api/jobs/", {"status": "failed", "kind": "report.export"})),
            (who, "list, status=queued,processing", lambda c=client: c.get(
                "/api/jobs/", {"status": ["queued", "processing"]})),
            (who, "list, page 51 (next x 50)", lambda c=client, u=deep: c.get(u)),
            (who, "list, cursor at the owner's oldest jobs", lambda c=client, u=deepest: c.get(u)),
            (who, "detail (with steps)", detail(client)),
        ]  # fmt: skip

    print(f"\njobstate API benchmark: {total:,} jobs, owner 'bench_user_01' has {mine:,}")
    versions = f"PostgreSQL {connection.pg_version // 10000}, Python {platform.python_version()}"
    print(f"{versions}, {args.repeat} runs each\n")
    print("| caller | request | p50 ms | p95 ms | max ms | Django CPU ms (p50) | queries |")
    print("|---|---|---:|---:|---:|---:|---:|")
    worst = 0.0
    for who, name, get in scenarios:
        if args.only not in f"{who} {name}":
            continue
        with CaptureQueriesContext(connection) as captured:
            get()
        queries = list(captured.captured_queries)  # the log is reset by later requests
        times, cpu = measure(get, args.repeat)
        p95 = percentile(times, 95)
        worst = max(worst, p95)
        print(
            f"| {who} | {name} | {statistics.median(times):.1f} | {p95:.1f} | {max(times):.1f} "
            f"| {statistics.median(cpu):.1f} | {len(queries)} |"
        )
        if args.explain and name.startswith("list"):
            sql = queries[-1]["sql"]
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
                plan = "\n".join("    " + row[0] for row in cursor.fetchall())
            print(f"\n    {who} / {name}:\n{plan}\n")
    verdict = "within" if worst < TARGET_MS else "OVER"
    print(f"\nworst p95: {worst:.1f} ms ({verdict} the {TARGET_MS:.0f} ms target)")
    print(f"load average while measuring: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
