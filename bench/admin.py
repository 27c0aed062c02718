"""Server-side render time of the admin pages on a large PostgreSQL database.

    python bench/admin.py                       # 1,000,000 jobs in jobstate_bench (seeded if needed)
    python bench/admin.py --reps 30 --slowest 3 # and show each page's slowest queries

The database comes from bench/seed.py (created and seeded on first use). Each
page is rendered in-process with Django's test client as a logged-in superuser:
two warm-up requests, then ``--reps`` timed ones; the script prints p50/p95 and
the number of SQL queries per page. The goal is p95 under 300 ms for the job
list (unfiltered and filtered), the stuck page and the dashboard.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import seed  # noqa: E402

TARGET_MS = 300.0


def pages() -> list[tuple[str, str, bool]]:
    """(label, url, counts toward the goal) for every page measured."""
    from django.contrib.auth import get_user_model
    from django.urls import reverse
    from django.utils import timezone

    from jobstate.ids import short
    from jobstate.models import Asset, Job

    jobs = reverse("admin:jobstate_job_changelist")
    owner = get_user_model().objects.filter(username="bench_user_07").values_list("pk", flat=True).first()
    key = Job.objects.filter(kind="report.export", key__isnull=False).values_list("key", flat=True).first()
    job = Job.objects.order_by("-created_at").values_list("pk", flat=True)[500]
    asset = Asset.objects.order_by("-created_at").values_list("job_id", flat=True).first()
    now = timezone.localtime()
    return [
        ("job list, unfiltered", jobs, True),
        ("job list, status=failed", f"{jobs}?status=failed", True),
        ("job list, status=queued", f"{jobs}?status=queued", True),
        ("job list, kind=etl.import", f"{jobs}?kind=etl.import", True),
        ("job list, owner", f"{jobs}?owner={owner}", True),
        ("job list, stuck=any", f"{jobs}?stuck=any", True),
        ("job list, kind+status", f"{jobs}?kind=email.send&status=completed", True),
        ("job list, this month", f"{jobs}?created_at__year={now.year}&created_at__month={now.month}", True),
        ("job list, search key", f"{jobs}?q={key}", True),
        # An id's first 13 characters are its creation time to the millisecond
        # (version 7): the jobs made in that millisecond, one here.
        ("job list, search id prefix", f"{jobs}?q={str(job)[:13]}", True),
        ("job list, search short id", f"{jobs}?q={short(job)}", True),
        ("job list, page 50", f"{jobs}?p=50", True),
        ("stuck page", reverse("admin:jobstate_job_stuck"), True),
        ("dashboard", reverse("admin:jobstate_job_dashboard"), True),
        ("job page", reverse("admin:jobstate_job_change", args=[job]), False),
        ("asset list", reverse("admin:jobstate_asset_changelist"), False),
        ("asset list, one job", f"{reverse('admin:jobstate_asset_changelist')}?job={asset}", False),
    ]


def measure(client: Any, url: str, reps: int) -> tuple[list[float], int, list[tuple[float, str]]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}")
    timings = []
    for _ in range(reps):
        started = time.perf_counter()
        response = client.get(url)
        response.content  # noqa: B018 - render fully
        timings.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    queries = sorted(((float(q["time"]) * 1000, q["sql"]) for q in captured.captured_queries), reverse=True)
    return timings, len(captured), queries


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def machine() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'jobstate_job'")
        rows = cursor.fetchone()[0]
    import django

    return (
        f"{os.cpu_count()} CPU, Python {platform.python_version()}, Django {django.get_version()}, "
        f"PostgreSQL {pg.split()[0]}, jobstate_job ~{rows:,} rows"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--db", default=seed.DEFAULT_DB)
    parser.add_argument("--server", default=seed.DEFAULT_SERVER)
    parser.add_argument("--reps", type=int, default=20, help="timed requests per page (default 20)")
    parser.add_argument("--slowest", type=int, default=0, help="print each page's N slowest queries")
    args = parser.parse_args()

    seed.ensure(args.jobs, args.owners, server=args.server, db=args.db)
    from django.contrib.auth import get_user_model
    from django.test import Client

    # No setup_test_environment(): its instrumented template rendering would be timed too.
    User = get_user_model()
    admin, _ = User.objects.get_or_create(
        username="bench_admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(admin)

    print(f"jobstate admin benchmark: {machine()}")
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.reps} timed requests per page after 2 warm-ups; goal p95 < {TARGET_MS:.0f} ms\n")
    print(f"{'page':<30} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'queries':>8}")
    failures = []
    for label, url, goal in pages():
        timings, n_queries, slow = measure(client, url, args.reps)
        p50, p95 = pct(timings, 0.5), pct(timings, 0.95)
        flag = "" if not goal else ("  ok" if p95 < TARGET_MS else "  OVER")
        if goal and p95 >= TARGET_MS:
            failures.append(label)
        print(f"{label:<30} {p50:>8.1f} {p95:>8.1f} {max(timings):>8.1f} {n_queries:>8}{flag}")
        for ms, sql in slow[: args.slowest]:
            print(f"    {ms:7.1f} ms  {sql[:160]}")
    print(f"\nload average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("all pages within the goal" if not failures else f"over the goal: {', '.join(failures)}")


if __name__ == "__main__":
    main()
