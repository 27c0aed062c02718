"""Fill a PostgreSQL database with N jobs (and their history, steps and assets)
for benchmarks: ``python bench/seed.py --jobs 1000000 --owners 50``.

Creates the database if needed (default ``jobstate_bench`` on the local
server), migrates it, and generates everything server-side with
``INSERT ... SELECT generate_series`` in batches, so a million jobs take about
a minute. Rows satisfy every model constraint: statuses, progress, error on
failure, finished_at on terminal jobs, leases on processing jobs, attempts
within max_attempts, steps with finished_at when finished.

Shape (deterministic; ``created_at`` rises with the row number, as in a real
queue): owners ``bench_user_01``.. round-robin (2% system jobs without owner),
8 kinds, statuses independent of owner and kind, ~70% completed, 8% failed, 4% cancelled, 3% partial, 10%
queued, 5% processing; 2-3 history rows per job; 3 steps per ``etl.import``
job; one asset per tenth completed job.

Re-running is a no-op when the database already holds at least ``--jobs``
jobs; ``--reset`` drops and recreates it. Other scripts import ``ensure()``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432"
DEFAULT_DB = "jobstate_bench"
KINDS = [
    "report.export",
    "image.resize",
    "etl.import",
    "email.send",
    "video.transcode",
    "index.rebuild",
    "billing.invoice",
    "demo.countdown",
]
# (status, share in percent): cumulative bands over i % 100.
STATUS_BANDS = [("completed", 70), ("failed", 8), ("cancelled", 4), ("partial", 3), ("queued", 10)]
BATCH = 100_000


def database_url(server: str, name: str) -> str:
    return f"{server.rstrip('/')}/{name}"


def create_database(server: str, name: str, *, reset: bool = False) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url(server, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and reset:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            exists = None
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def setup_django(url: str, settings: str = "project.settings") -> None:
    """Point Django at ``url`` (call before anything imports Django models)."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    os.environ.setdefault("DJANGO_DEBUG", "0")  # no query log growing in memory
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _status_case(column: str = "h") -> str:
    parts, low = [], 0
    for status, share in STATUS_BANDS:
        parts.append(f"WHEN {column} % 100 < {low + share} THEN '{status}'")
        low += share
    return "CASE " + " ".join(parts) + " ELSE 'processing' END"


def _kinds_array() -> str:
    return "ARRAY[" + ",".join(f"'{k}'" for k in KINDS) + "]::text[]"


JOBS_SQL = """
INSERT INTO jobstate_job (
    id, kind, owner_id, key, status, progress, progress_message, current_step,
    parameters, result, error_message, error_type, traceback, priority, attempts,
    max_attempts, run_after, worker_id, lease_token, lease_expires_at, heartbeat_at,
    cancel_requested_at, created_at, updated_at, started_at, finished_at
)
SELECT
    -- A version 7 UUID from the job's creation time, as jobstate.ids makes them:
    -- its first 48 bits are the time in milliseconds, the rest stays random.
    encode(set_byte(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM created) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
        6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid,
    kind,
    CASE WHEN (h / 100) % 50 = 0 THEN NULL ELSE (%(owners)s)[1 + (g % %(n_owners)s)] END,
    CASE WHEN status = 'completed' AND g % 7 = 0 THEN 'bench-' || g END,
    status,
    CASE WHEN status IN ('completed', 'partial') THEN 100
         WHEN status = 'queued' THEN 0 ELSE (g * 37) % 100 END,
    CASE WHEN status = 'processing' THEN 'step ' || (g % 5) || ' of 5' ELSE '' END,
    CASE WHEN status = 'processing' AND kind = 'etl.import' THEN 'process' ELSE '' END,
    jsonb_build_object('n', g, 'size', g % 1000),
    CASE WHEN status IN ('completed', 'partial') THEN jsonb_build_object('rows', g % 5000) END,
    CASE WHEN status = 'failed' THEN 'upstream timed out after 30s'
         WHEN status = 'partial' THEN '3 rows rejected' ELSE '' END,
    CASE WHEN status = 'failed' THEN 'TimeoutError' ELSE '' END,
    '',
    CASE WHEN (h / 5000) % 20 = 0 THEN 5 WHEN (h / 5000) % 20 = 1 THEN -5 ELSE 0 END,
    CASE WHEN status = 'queued' THEN 0 WHEN status = 'failed' THEN 3 ELSE 1 END,
    3,
    created,
    CASE WHEN status = 'processing' THEN 'bench-worker-' || (g % 4) ELSE '' END,
    CASE WHEN status = 'processing' THEN gen_random_uuid() END,
    CASE WHEN status = 'processing' THEN now() + interval '60 seconds' END,
    CASE WHEN status = 'processing' THEN now() END,
    CASE WHEN status = 'processing' AND g % 25 = 0 THEN now() END,
    created,
    created + interval '2 seconds',
    CASE WHEN status <> 'queued' THEN created + interval '1 second' END,
    CASE WHEN status IN ('completed', 'failed', 'cancelled', 'partial')
         THEN created + interval '1 second' + (g % 600) * interval '1 second' END
FROM (
    SELECT g, h,
           {status} AS status,
           ({kinds})[1 + (h / 7) % {n_kinds}] AS kind,
           %(start)s::timestamptz + g * %(step)s::interval + (g % 7) * interval '1 microsecond' AS created
    FROM generate_series(%(low)s::bigint, %(high)s::bigint) AS g,
         -- a multiplicative hash, so status, kind and owner do not move in step
         LATERAL (SELECT (g * 2654435761) % 4294967296 AS h) AS hashed
) AS s
"""

EVENTS_SQL = """
INSERT INTO jobstate_jobevent
    (job_id, from_status, to_status, transition, actor_id, actor_label, reason, metadata, created_at)
SELECT j.id, e.from_status, e.to_status, e.transition, e.actor_id, e.actor_label, e.reason, '{}'::jsonb, e.at
FROM jobstate_job j
CROSS JOIN LATERAL (VALUES
    (1, '', 'queued', 'enqueue', j.owner_id, 'api', '', j.created_at),
    (2, 'queued', 'processing', 'claim', NULL::integer, 'worker:' || 'bench', '', j.started_at),
    (3, 'processing', j.status, CASE j.status WHEN 'completed' THEN 'complete'
        WHEN 'partial' THEN 'mark_partial' WHEN 'failed' THEN 'fail' ELSE 'cancel' END,
        NULL::integer, 'worker:bench', j.error_message, j.finished_at)
) AS e(n, from_status, to_status, transition, actor_id, actor_label, reason, at)
WHERE j.created_at >= %(low)s AND j.created_at < %(high)s
  AND (e.n = 1 OR (e.n = 2 AND j.started_at IS NOT NULL) OR (e.n = 3 AND j.finished_at IS NOT NULL))
"""

STEPS_SQL = """
INSERT INTO jobstate_jobstep
    (job_id, position, name, status, attempts, cursor, output, error_message, detail,
     started_at, finished_at, updated_at)
SELECT j.id, s.position, s.name,
       CASE WHEN j.status = 'completed' THEN 'completed'
            WHEN j.status = 'processing' AND s.position = 0 THEN 'completed'
            WHEN j.status = 'processing' AND s.position = 1 THEN 'running'
            ELSE 'pending' END,
       CASE WHEN j.status IN ('completed', 'processing') AND s.position <= 1 THEN 1 ELSE 0 END,
       CASE WHEN j.status = 'processing' AND s.position = 1 THEN jsonb_build_object('offset', 500) END,
       CASE WHEN j.status = 'completed' THEN jsonb_build_object('rows', 100 * (s.position + 1)) END,
       '', '{}'::jsonb,
       CASE WHEN j.status IN ('completed', 'processing') THEN j.started_at END,
       CASE WHEN j.status = 'completed' OR (j.status = 'processing' AND s.position = 0)
            THEN coalesce(j.finished_at, j.started_at) END,
       j.updated_at
FROM jobstate_job j
CROSS JOIN (VALUES (0, 'download'), (1, 'process'), (2, 'finalize')) AS s(position, name)
WHERE j.kind = 'etl.import' AND j.created_at >= %(low)s AND j.created_at < %(high)s
"""

ASSETS_SQL = """
INSERT INTO jobstate_asset
    (id, job_id, owner_id, asset_type, name, file, url, storage_path, size, content_type,
     sha256, metadata, created_at, attempt, attempt_lost)
SELECT gen_random_uuid(), j.id, j.owner_id, 'report', 'report.csv',
       'jobstate/' || j.id || '/report.csv', '', 'jobstate/' || j.id || '/report.csv',
       1024 + (j.progress * 10), 'text/csv', md5(j.id::text) || md5(j.kind), '{}'::jsonb, j.finished_at,
       j.attempts, false
FROM jobstate_job j
WHERE j.status = 'completed' AND (j.parameters->>'n')::bigint % 10 = 0
  AND j.created_at >= %(low)s AND j.created_at < %(high)s
"""


def _escape(sql: str) -> str:
    """Double the modulo operators' % for the driver; keep %(name)s parameters."""
    return re.sub(r"%(?!\()", "%%", sql)


def _owner_ids(cursor: Any, owners: int) -> list[int]:
    from django.contrib.auth.hashers import make_password

    password = make_password("bench-password")
    ids = []
    for n in range(1, owners + 1):
        cursor.execute(
            """INSERT INTO auth_user (username, password, is_superuser, is_staff, is_active,
                   first_name, last_name, email, date_joined)
               VALUES (%s, %s, false, false, true, '', '', '', now())
               ON CONFLICT (username) DO UPDATE SET is_active = true RETURNING id""",
            [f"bench_user_{n:02d}", password],
        )
        ids.append(cursor.fetchone()[0])
    return ids


def seed(jobs: int, owners: int, *, days: int = 90, log: Any = print) -> None:
    """Insert ``jobs`` jobs with their events, steps and assets (Django set up)."""
    from datetime import UTC, datetime, timedelta

    from django.db import connection, transaction

    start = datetime.now(UTC) - timedelta(days=days)
    step = timedelta(days=days) / max(jobs, 1)
    sql = _escape(JOBS_SQL.format(status=_status_case(), kinds=_kinds_array(), n_kinds=len(KINDS)))
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET maintenance_work_mem = '512MB'")
        with transaction.atomic():
            owner_ids = _owner_ids(cursor, owners)
        started = time.monotonic()
        for low in range(0, jobs, BATCH):
            high = min(low + BATCH, jobs) - 1
            lo_t, hi_t = start + low * step, start + (high + 1) * step
            window = {"low": lo_t, "high": hi_t}
            with transaction.atomic():
                cursor.execute(
                    sql,
                    {
                        "owners": owner_ids,
                        "n_owners": len(owner_ids),
                        "start": start,
                        "step": step,
                        "low": low,
                        "high": high,
                    },
                )
                for statement in (EVENTS_SQL, STEPS_SQL, ASSETS_SQL):
                    cursor.execute(_escape(statement), window)
            log(f"  {high + 1:>9,} jobs  ({time.monotonic() - started:5.1f} s)")
        cursor.execute("VACUUM ANALYZE jobstate_job")
        for table in ("jobstate_jobevent", "jobstate_jobstep", "jobstate_asset", "auth_user"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    log(f"seeded {jobs:,} jobs in {time.monotonic() - started:.1f} s")


def job_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobstate_job")
        return int(cursor.fetchone()[0])


def ensure(
    jobs: int = 1_000_000,
    owners: int = 50,
    *,
    server: str = DEFAULT_SERVER,
    db: str = DEFAULT_DB,
    reset: bool = False,
    log: Any = print,
) -> str:
    """Create, migrate and seed the benchmark database unless it already holds
    ``jobs`` jobs; set Django up on it and return its URL."""
    url = database_url(server, db)
    create_database(server, db, reset=reset)
    setup_django(url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    have = job_count()
    if have >= jobs:
        log(f"{db}: {have:,} jobs already; nothing to do (--reset to start over)")
        return url
    if have:
        raise SystemExit(f"{db} holds {have:,} jobs, fewer than {jobs:,}: run with --reset")
    log(f"{db}: seeding {jobs:,} jobs for {owners} owners")
    seed(jobs, owners, log=log)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="number of jobs (default 1,000,000)")
    parser.add_argument("--owners", type=int, default=50, help="number of owning users (default 50)")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"database name (default {DEFAULT_DB})")
    parser.add_argument("--server", default=DEFAULT_SERVER, help=f"PostgreSQL server URL ({DEFAULT_SERVER})")
    parser.add_argument("--reset", action="store_true", help="drop and recreate the database first")
    args = parser.parse_args()
    if args.jobs < 1 or args.owners < 1:
        parser.error("--jobs and --owners must be at least 1")
    url = ensure(args.jobs, args.owners, server=args.server, db=args.db, reset=args.reset)
    print(f"DATABASE_URL={url}")


if __name__ == "__main__":
    main()
