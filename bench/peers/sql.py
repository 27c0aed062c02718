"""The framework-free ceiling: a bare psycopg worker loop (no Django).

    python -m bench.peers.sql --dsn postgres://... --claim 10

Jobs live in ``bench_sql_job`` (status, lease, progress) with a history table
``bench_sql_event``: one row at enqueue, one per claim and one at completion,
like jobstate. A claim takes up to ``--claim`` ready rows with
``FOR UPDATE SKIP LOCKED`` and writes their history rows in the same
transaction; every progress update and the completion (with its history row)
is one transaction. An idle worker polls every ``--poll`` seconds.
"""

from __future__ import annotations

import argparse
import signal
import time
import uuid

SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_sql_job (
    id bigserial PRIMARY KEY,
    status varchar(20) NOT NULL DEFAULT 'queued',
    worker text NOT NULL DEFAULT '',
    lease_token uuid,
    lease_expires_at timestamptz,
    progress smallint NOT NULL DEFAULT 0,
    message varchar(100) NOT NULL DEFAULT '',
    enqueued double precision NOT NULL,
    started double precision,
    finished double precision
);
CREATE INDEX IF NOT EXISTS bench_sql_job_ready ON bench_sql_job (id) WHERE status = 'queued';
CREATE TABLE IF NOT EXISTS bench_sql_event (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    transition varchar(20) NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bench_sql_event_job ON bench_sql_event (job_id);
"""

ENQUEUE = """
WITH jobs AS (
    INSERT INTO bench_sql_job (enqueued) SELECT %s FROM generate_series(1, %s) RETURNING id
)
INSERT INTO bench_sql_event (job_id, transition) SELECT id, 'enqueue' FROM jobs
"""

CLAIM = """
WITH picked AS (
    SELECT id FROM bench_sql_job WHERE status = 'queued' ORDER BY id
    LIMIT %(n)s FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE bench_sql_job j SET status = 'processing', worker = %(me)s, lease_token = %(token)s,
        lease_expires_at = now() + interval '60 seconds'
    FROM picked WHERE j.id = picked.id RETURNING j.id
), events AS (
    INSERT INTO bench_sql_event (job_id, transition) SELECT id, 'claim' FROM claimed
)
SELECT id FROM claimed
"""

PROGRESS = """
UPDATE bench_sql_job SET progress = %s, message = %s, lease_expires_at = now() + interval '60 seconds'
WHERE id = %s AND lease_token = %s
"""

COMPLETE = """
WITH done AS (
    UPDATE bench_sql_job SET status = 'completed', progress = 100, started = %s, finished = %s,
        lease_token = NULL, lease_expires_at = NULL
    WHERE id = %s AND lease_token = %s RETURNING id
)
INSERT INTO bench_sql_event (job_id, transition) SELECT id, 'complete' FROM done
"""


def main() -> None:
    import psycopg

    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--claim", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.02)
    args = parser.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    me = f"sql:{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        while not stop:
            token = uuid.uuid4()
            with conn.transaction():
                ids = [r[0] for r in conn.execute(CLAIM, {"n": args.claim, "me": me, "token": token})]
            if not ids:
                time.sleep(args.poll)
                continue
            for job_id in ids:
                started = time.time()
                for step in (1, 2, 3):
                    conn.execute(PROGRESS, [25 * step, f"step {step} of 3", job_id, token])
                conn.execute(COMPLETE, [started, time.time(), job_id, token])


if __name__ == "__main__":
    main()
