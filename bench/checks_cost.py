"""What the job table's CHECK constraints cost each write (a script, not a test).

    .venv/bin/python bench/checks_cost.py                # the server of 127.0.0.1:5432
    .venv/bin/python bench/checks_cost.py --pg postgres://postgres@127.0.0.1:5496

PostgreSQL evaluates every CHECK constraint of a table on every UPDATE, whatever
columns it writes, and builds each one's expression again for every statement
(``ExecRelCheck``: parsed from its stored form and prepared), which a prepared
statement does not save. This script measures that on a progress write, the
statement a running job makes most.

It migrates a database of its own (``--db``, dropped at the end), copies ``jobstate_job`` three
times (``CREATE TABLE ... (LIKE jobstate_job INCLUDING DEFAULTS ...)``: with its primary key
alone; with its indexes; with its indexes and its CHECK constraints), fills each copy and the
job table itself (which also has its foreign keys: their triggers) with the same running jobs,
and then runs the progress write (prepared, autocommit, ``synchronous_commit`` off so that no
fsync blurs the figure) on one table after the other, in alternating chunks, reading the
backend's CPU time from ``/proc/<pid>/schedstat`` (nanoseconds) around each chunk. The server
must run on this machine. Alternating cancels the machine's drift, which between two separate
runs is larger than the differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = 10_000
TOKEN = "00000000-0000-0000-0000-000000000001"
FILL = """
INSERT INTO {table} (id, kind, status, parameters, error_message, error_type, traceback,
    priority, max_attempts, run_after, lease_token, created_at, worker_id, attempts, started_at,
    lease_expires_at, heartbeat_at, updated_at, progress, progress_message, current_step)
SELECT md5(n::text)::uuid, 'bench.checks', 'processing', '{{"i": 1}}', '', '', '', 0, 1, now(),
    %s, now(), 'w', 1, now(), now() + interval '1 minute', now(), now(), 0, '', ''
FROM generate_series(1, %s) n
"""
# The statement jobstate's progress write prepares (jobstate.services.lease).
PROGRESS = (
    'UPDATE {table} SET "progress" = %s, "progress_message" = %s, "heartbeat_at" = now(), '
    '"lease_expires_at" = now(), "updated_at" = now() WHERE "id" = %s AND "status" = %s '
    'AND "lease_token" = %s AND "cancel_requested_at" IS NULL'
)
# label: (table, what LIKE copies; None: the job table itself)
TABLES = {
    "key": ("bench_checks_key", "INCLUDING DEFAULTS"),
    "without": ("bench_checks_without", "INCLUDING DEFAULTS INCLUDING INDEXES"),
    "with": ("bench_checks_with", "INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING CONSTRAINTS"),
    "job": ("jobstate_job", None),
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server URL")
    parser.add_argument(
        "--db", default="jobstate_bench_checks", help="scratch database (created, then dropped)"
    )
    parser.add_argument("--chunks", type=int, default=25, help="chunks per table (at least 3)")
    parser.add_argument("--chunk", type=int, default=400, help="statements per chunk")
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.chunks < 3:
        raise SystemExit("--chunks: at least 3 (the first 2 only warm up)")
    import psycopg

    pg = args.pg.rstrip("/")
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [args.db]).fetchone():
            conn.execute(f'CREATE DATABASE "{args.db}"')
    os.environ.update(DATABASE_URL=f"{pg}/{args.db}", DJANGO_SETTINGS_MODULE="project.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "jobstate", verbosity=0)

    conn = psycopg.connect(f"{pg}/{args.db}", autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    schedstat = Path(f"/proc/{pid}/schedstat")
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists() or not cmdline.read_bytes().startswith(b"postgres"):
        raise SystemExit("the server must run on this machine (its backend's /proc entry is read)")
    checks = conn.execute(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = 'jobstate_job'::regclass AND contype = 'c'"
    ).fetchone()[0]
    # LIKE does not copy storage options: the job table's fill factor (room on
    # each page for the new row versions of HOT updates) is set on both copies.
    options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'jobstate_job'::regclass").fetchone()[
        0
    ]
    storage = f" WITH ({', '.join(options)})" if options else ""
    for table, like in TABLES.values():
        if like is not None:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (LIKE jobstate_job {like}){storage}")
            if "INDEXES" not in like:
                conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
        conn.execute(FILL.format(table=table), [TOKEN, ROWS])
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("SET synchronous_commit = off")

    def cpu_ns() -> int:
        return int(schedstat.read_text().split()[0])

    per: dict[str, list[float]] = {label: [] for label in TABLES}
    ids = [r[0] for r in conn.execute(f"SELECT id FROM {TABLES['with'][0]} ORDER BY id")]
    n = 0
    try:
        for _ in range(args.chunks):
            for label, (table, _like) in TABLES.items():
                sql = PROGRESS.format(table=table)
                before = cpu_ns()
                for _ in range(args.chunk):
                    n += 1
                    params = [n % 100, "step", ids[n % len(ids)], "processing", TOKEN]
                    conn.execute(sql, params, prepare=True)
                per[label].append((cpu_ns() - before) / args.chunk / 1000)
    finally:
        conn.close()
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')

    # The first chunks warm the caches and prepare the statements.
    med = {label: statistics.median(values[2:]) for label, values in per.items()}
    print(
        f"progress write, database CPU per statement (median of {args.chunks - 2} chunks of "
        f"{args.chunk}, alternating):"
    )
    print(f"  without CHECK constraints: {med['without']:.1f} us")
    print(f"  with the {checks} of jobstate_job:  {med['with']:.1f} us")
    extra = med["with"] - med["without"]
    print(f"  the constraints: {extra:+.1f} us ({med['with'] / med['without'] - 1:+.0%})")
    indexes = med["without"] - med["key"]
    print(f"  its primary key alone, no CHECK: {med['key']:.1f} us (the other indexes: {indexes:+.1f} us)")
    fks = med["job"] - med["with"]
    print(
        f"  jobstate_job itself (its foreign keys too): {med['job']:.1f} us (the foreign keys: {fks:+.1f} us)"
    )


if __name__ == "__main__":
    main()
