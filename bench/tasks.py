"""The same workload as a plain django-q2 task: three progress updates to a row,
then the row marked done (no lease, no history)."""

import time

from django.db import connection

TABLE = "bench_plain_job"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigserial PRIMARY KEY,
    status varchar(20) NOT NULL DEFAULT 'queued',
    progress smallint NOT NULL DEFAULT 0,
    message varchar(100) NOT NULL DEFAULT '',
    enqueued double precision NOT NULL,
    started double precision,
    finished double precision
)
"""


def plain_job(row_id: int) -> None:
    started = time.time()
    with connection.cursor() as cursor:
        for step in (1, 2, 3):
            cursor.execute(
                f"UPDATE {TABLE} SET progress = %s, message = %s WHERE id = %s",
                [25 * step, f"step {step} of 3", row_id],
            )
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'completed', progress = 100, started = %s, finished = %s "
            "WHERE id = %s",
            [started, time.time(), row_id],
        )
