"""What random job ids cost in WAL once the table is large (a script, not a test).

    .venv/bin/python bench/ids.py                      # the server of 127.0.0.1:5432
    .venv/bin/python bench/ids.py --existing 500000 --jobs 5000 --rounds 3

After a checkpoint, PostgreSQL logs the whole of a page (8 KB, a "full-page
image") the first time it changes. The job's primary key, the history's
``(job, id)`` index and the assets' job index are keyed by the job's id: with
random (version 4) UUIDs a few thousand new jobs change most leaf pages of those
indexes, so every checkpoint cycle logs most of them again; with time-ordered
(version 7) UUIDs, what jobstate makes (``jobstate.ids``), new jobs go to the
right-hand end, as with a sequence. ``bench/drain.py`` starts from an empty
table and takes no checkpoint while it runs, so it cannot show this.

Each round and each id version, in alternation (v4 first in odd rounds, v7 first
in even ones), in a database of its own
(``--db``): the job and history tables are emptied and filled with
``--existing`` finished jobs (ids of that version, three history rows each, as
``bench/admin.py``'s seed keeps), vacuumed; then ``CHECKPOINT``, and
``--jobs`` new jobs (ids of that version) go the way every job goes, in this
process: ``enqueue_many``, claimed ten at a time, three progress writes, completed.
Printed per version: WAL bytes per job (``pg_current_wal_lsn()`` before and
after) and full-page images per job (``pg_stat_wal``), medians of the rounds.
WAL is server-wide: run on a quiet server. A checkpoint that falls inside a
measurement (``pg_stat_bgwriter``) is printed on its round's line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

INSERT = """
INSERT INTO jobstate_job (id, kind, status, progress, progress_message, current_step, parameters,
    result, error_message, error_type, traceback, priority, attempts, max_attempts, run_after,
    worker_id, created_at, updated_at, started_at, finished_at)
SELECT id, 'bench.drain', 'completed', 100, '', '', '{"i": 1}', '{"ok": true}', '', '', '', 0, 1, 1,
    t, 'w', t, t, t, t + interval '1 second'
FROM (SELECT id, now() - (%s - n) * interval '1 second' AS t FROM bench_ids) AS s ORDER BY t
"""
SEED_EVENTS = """
INSERT INTO jobstate_jobevent (job_id, from_status, to_status, transition, actor_label, reason,
    metadata, created_at)
SELECT id, s.f, s.t, s.tr, 'bench', '', '{}', created_at FROM jobstate_job,
    (VALUES ('', 'queued', 'enqueue', 1), ('queued', 'processing', 'claim', 2),
            ('processing', 'completed', 'complete', 3)) AS s(f, t, tr, o)
ORDER BY created_at, id, s.o
"""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server URL")
    parser.add_argument("--db", default="jobstate_bench_ids", help="scratch database (created, then dropped)")
    parser.add_argument("--existing", type=int, default=300_000, help="finished jobs already in the table")
    parser.add_argument("--jobs", type=int, default=5000, help="new jobs per round and version")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each figure is their median")
    return parser.parse_args()


def main() -> None:
    args = parse()
    import psycopg

    pg = args.pg.rstrip("/")
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    try:
        results = run(args, f"{pg}/{args.db}")
    finally:
        if "django.db" in sys.modules:
            from django.db import connections

            connections.close_all()
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
    print(
        f"{args.jobs} new jobs after a checkpoint, on a table of {args.existing} finished jobs "
        f"(medians of {args.rounds} rounds):"
    )
    print("| job ids | WAL bytes/job | full-page images/job |")
    print("|---|---:|---:|")
    for label, rows in results.items():
        wal = statistics.median(r[0] for r in rows)
        fpi = statistics.median(r[1] for r in rows)
        print(f"| {label} | {wal:,.0f} | {fpi:.2f} |")


def run(args: argparse.Namespace, url: str) -> dict[str, list[tuple[float, float]]]:
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="bench.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from jobstate import ids, services

    # The module (jobstate.services.enqueue is also the name of a function).
    enqueue = importlib.import_module("jobstate.services.enqueue")

    call_command("migrate", verbosity=0)
    versions: dict[str, Callable[[], uuid.UUID]] = {
        "random (version 4)": uuid.uuid4,
        "time-ordered (version 7, jobstate's)": ids.new_id,
    }
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in versions}
    for n in range(args.rounds):
        order = list(versions.items())
        for label, make in order if n % 2 == 0 else reversed(order):
            seed(connection, args.existing, make)
            vars(enqueue)["new_id"] = make  # the ids enqueue_many gives
            try:
                before = wal(connection, checkpoint=True)
                drain(services, args.jobs)
                after = wal(connection)
            finally:
                vars(enqueue)["new_id"] = ids.new_id
            results[label].append(((after[0] - before[0]) / args.jobs, (after[1] - before[1]) / args.jobs))
            note = ", a checkpoint fell inside" if after[2] != before[2] else ""
            print(f"  {label}: {results[label][-1][0]:,.0f} B/job, {results[label][-1][1]:.2f} FPI/job{note}")
    return results


def seed(connection: Any, n: int, make: Callable[[], uuid.UUID]) -> None:
    """``n`` finished jobs with ids from ``make``, oldest first, and their history."""
    raw = connection.connection
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobstate_jobevent, jobstate_job RESTART IDENTITY CASCADE")
        cursor.execute("CREATE TEMPORARY TABLE bench_ids (n serial, id uuid)")
        with raw.cursor().copy("COPY bench_ids (id) FROM STDIN") as copy:
            for _ in range(n):
                copy.write_row((make(),))
        cursor.execute(INSERT, [n])
        cursor.execute("DROP TABLE bench_ids")
        cursor.execute(SEED_EVENTS)
        cursor.execute("VACUUM ANALYZE jobstate_job")
        cursor.execute("VACUUM ANALYZE jobstate_jobevent")


def drain(services: Any, n: int) -> None:
    services.enqueue_many([("bench.drain", {"i": i}) for i in range(n)])
    while batch := services.claim("bench-ids", ["bench.drain"], limit=10, start=True):
        for job in batch:
            for step in (1, 2, 3):
                services.report_progress(job, job.lease_token, 25 * step, f"step {step} of 3")
            services.complete(job, job.lease_token, {"ok": True})


def wal(connection: Any, checkpoint: bool = False) -> tuple[int, int, int]:
    """(WAL bytes, full-page images, checkpoints) so far, server-wide, after a
    checkpoint if asked."""
    with connection.cursor() as cursor:
        if checkpoint:
            cursor.execute("CHECKPOINT")
        # This backend's WAL counters reach pg_stat_wal when its next transaction ends.
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT pg_current_wal_lsn() - '0/0', wal_fpi, checkpoints_timed + checkpoints_req "
            "FROM pg_stat_wal, pg_stat_bgwriter"
        )
        lsn, fpi, checkpoints = cursor.fetchone()
    return int(lsn), int(fpi), int(checkpoints)


if __name__ == "__main__":
    main()
