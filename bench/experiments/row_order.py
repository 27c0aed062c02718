"""WAL of a claim and an outcome with the columns they write before or after the
parameters (the row order of migration 0017), for a few parameter sizes.

    .venv/bin/python bench/experiments/row_order.py [--pg postgres://postgres@127.0.0.1:5432]

Two tables shaped like jobstate_job's front and back, one with ``status`` and the
outcome's columns before ``parameters`` (the order before 0017), one with them
after; 2,000 queued rows each; then 1,000 claims and outcomes (two UPDATEs per
row, each in its own transaction, as a worker makes them) on each, after a
checkpoint and a first write of every page, so that neither pays full-page
images. Prints the WAL bytes per claim and outcome. Runs in a scratch database
that it drops at the end.
"""

from __future__ import annotations

import argparse

import psycopg

DB = "jobstate_bench_row_order"
COLUMNS = {
    "spread": "id uuid PRIMARY KEY, kind text, status text, parameters jsonb, lease uuid,"
    " finished timestamptz, result jsonb, created timestamptz, worker text, heartbeat timestamptz,"
    " progress int",
    "tail": "id uuid PRIMARY KEY, kind text, parameters jsonb, created timestamptz, status text, lease uuid,"
    " finished timestamptz, result jsonb, worker text, heartbeat timestamptz, progress int",
}


def measure(conn: psycopg.Connection, table: str, size: int) -> float:
    run = conn.execute
    run(f"DROP TABLE IF EXISTS {table}")
    run(f"CREATE TABLE {table} ({COLUMNS[table]}) WITH (fillfactor = 85)")
    run(f"CREATE INDEX ON {table} (status)")  # as in jobstate: neither update can be HOT
    run(
        f"INSERT INTO {table} (id, kind, status, parameters, created) SELECT gen_random_uuid(), 'k',"
        " 'queued', jsonb_build_object('body', repeat('x', %s::int)), now() FROM generate_series(1, 2000)",
        [size],
    )
    ids = [row[0] for row in run(f"SELECT id FROM {table} LIMIT 1000").fetchall()]
    run("CHECKPOINT")
    run(f"UPDATE {table} SET heartbeat = now()")  # each page's full image, before the count
    start = run("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    for pk in ids:
        run(
            f"UPDATE {table} SET status = 'processing', lease = gen_random_uuid(), worker = 'vm:1:2',"
            " heartbeat = now() WHERE id = %s",
            [pk],
        )
        run(
            f"UPDATE {table} SET status = 'completed', lease = NULL, finished = now(),"
            """ result = '{"rows": 1}', progress = 100 WHERE id = %s""",
            [pk],
        )
    (wal,) = run("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start]).fetchone()
    return float(wal) / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--sizes", default="8,500,1500", help="parameter sizes in bytes")
    args = parser.parse_args()
    server = args.pg.rstrip("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB}"')
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        with psycopg.connect(f"{server}/{DB}", autocommit=True) as conn:
            print("parameters  WAL bytes per claim + outcome: status before them | after them")
            for size in (int(s) for s in args.sizes.split(",")):
                before, after = measure(conn, "spread", size), measure(conn, "tail", size)
                print(f"{size:>10}  {before:>12,.0f} | {after:,.0f}")
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
