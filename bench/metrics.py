"""Time of a /metrics/ scrape on a large PostgreSQL database.

    python bench/metrics.py                                # 1,000,000 jobs in jobstate_bench
    python bench/metrics.py --jobs 200000 --db jobstate_bench_200k --reps 30

The database comes from bench/seed.py (created and seeded on first use). The
script times, in-process, with Django's test client and METRICS_ACCESS "open":

- the gauge snapshot (the grouped queries a background refresh runs every
  METRICS_CACHE_SECONDS, off the scrape's path);
- the first scrape of a process (it takes the snapshot itself);
- warm scrapes with no new history, p50/p95;
- warm scrapes after ``--batch`` jobs were enqueued, claimed and completed
  (3 history rows each) since the previous one, p50/p95 (answered from memory),
  and the fold of those rows into the counters that a background refresh does.

The goal: a warm scrape under 50 ms.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import seed  # noqa: E402

TARGET_MS = 50.0


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--server", default=seed.DEFAULT_SERVER)
    parser.add_argument("--db", default=seed.DEFAULT_DB)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=500, help="jobs run between two busy scrapes")
    args = parser.parse_args()
    seed.ensure(args.jobs, args.owners, server=args.server, db=args.db)

    from django.conf import settings
    from django.test import Client
    from django.test.utils import override_settings, setup_test_environment
    from django.utils import timezone

    from jobstate import registry, services
    from jobstate.metrics import gauges, totals
    from jobstate.models import Job, JobEvent

    setup_test_environment()
    overrides = {**getattr(settings, "JOBSTATE", {}), "METRICS_ACCESS": "open", "METRICS_CACHE_SECONDS": 3600}
    kind = sorted(n for n, spec in registry.all_handlers().items() if spec.schema is None)[0]
    client = Client()

    def scrape() -> float:
        started = time.perf_counter()
        response = client.get("/metrics/")
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, response.status_code
        return elapsed

    def run_batch() -> None:
        jobs = services.enqueue_many([(kind, {})] * args.batch)
        claimed = services.claim("bench-metrics", kinds=[kind], limit=args.batch)
        for job in claimed:
            services.complete(job, job.lease_token, {})
        assert len(claimed) == len(jobs)

    with override_settings(JOBSTATE=overrides):
        jobs, events = Job.objects.count(), JobEvent.objects.count()
        started = time.perf_counter()
        gauges.take()
        snapshot_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        totals.fold()
        fold_ms = (time.perf_counter() - started) * 1000
        gauges.reset()
        first_ms = scrape()
        warm = [scrape() for _ in range(args.reps)]
        busy, folds = [], []
        for _ in range(args.reps):
            run_batch()
            busy.append(scrape())
            # What the background refresh then does with the batch's history rows
            # (the scrape above answered from memory): fold them into the counters.
            started = time.perf_counter()
            totals.fold(now=timezone.now() + timedelta(minutes=5))  # past the settle window
            folds.append((time.perf_counter() - started) * 1000)
        Job.objects.filter(kind=kind, worker_id="bench-metrics").delete()

    print(f"# /metrics/ scrape, {time.strftime('%Y-%m-%d')}, {platform.node()}, {platform.processor() or ''}")
    print(f"# {jobs:,} jobs, {events:,} history rows; python bench/metrics.py {' '.join(sys.argv[1:])}")
    print(f"gauge snapshot (background refresh)     {snapshot_ms:8.1f} ms")
    print(f"first fold (cursor placed)              {fold_ms:8.1f} ms")
    print(f"first scrape of a process               {first_ms:8.1f} ms")
    print(f"warm scrape, no new history   p50/p95   {statistics.median(warm):8.1f} / {p95(warm):.1f} ms")
    print(
        f"warm scrape, +{args.batch * 3} history rows  p50/p95   "
        f"{statistics.median(busy):8.1f} / {p95(busy):.1f} ms"
    )
    print(
        f"fold of +{args.batch * 3} history rows (background) p50/p95   "
        f"{statistics.median(folds):8.1f} / {p95(folds):.1f} ms"
    )
    worst = max(p95(warm), p95(busy))
    print(f"goal: warm p95 < {TARGET_MS:.0f} ms: {'met' if worst < TARGET_MS else 'NOT met'}")


if __name__ == "__main__":
    main()
