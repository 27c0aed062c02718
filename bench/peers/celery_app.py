"""Celery 5 with Redis as broker, no result backend (no job state in PostgreSQL
beyond the benchmark row the task updates, over a persistent psycopg connection
per worker process).

    celery -A bench.peers.celery_app worker -c 2 --pool prefork
"""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("bench", broker=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
_conn = None


def _connection():  # type: ignore[no-untyped-def]
    global _conn
    if _conn is None or _conn.closed:
        import psycopg

        _conn = psycopg.connect(os.environ["BENCH_DSN"], autocommit=True)
    return _conn


@app.task(name="bench.plain_job")
def plain_job(row_id: int) -> None:
    from bench.tasks import TABLE

    started = time.time()
    conn = _connection()
    for step in (1, 2, 3):
        conn.execute(
            f"UPDATE {TABLE} SET progress = %s, message = %s WHERE id = %s",
            [25 * step, f"step {step} of 3", row_id],
        )
    conn.execute(
        f"UPDATE {TABLE} SET status = 'completed', progress = 100, started = %s, finished = %s WHERE id = %s",
        [started, time.time(), row_id],
    )
