"""The benchmark task for Django 6.1's tasks framework (django-tasks-db), and the
driver bench/drain.py calls under the Django 6 venv to enqueue it:

    DJANGO_SETTINGS_MODULE=bench.settings_tasksdb python -m bench.tasksdb_tasks N [RATE]

N jobs, each a ``bench_plain_job`` row plus a task; all in one transaction
(the framework has no bulk enqueue), or one by one at RATE jobs/s.
"""

from __future__ import annotations

import sys
import time

from django.tasks import task

from bench.tasks import plain_job as _plain_job


@task()
def plain_job(row_id: int) -> None:
    _plain_job(row_id)


def _enqueue(cursor, n: int) -> None:  # type: ignore[no-untyped-def]
    # Imported by its name: run as ``-m`` this module is ``__main__``, which
    # the worker could not import.
    from bench.tasks import TABLE
    from bench.tasksdb_tasks import plain_job

    cursor.execute(
        f"INSERT INTO {TABLE} (enqueued) SELECT %s FROM generate_series(1, %s) RETURNING id", [time.time(), n]
    )
    for (row_id,) in cursor.fetchall():
        plain_job.enqueue(row_id)


def main() -> None:
    import django

    django.setup()
    from django.db import connection, transaction

    n = int(sys.argv[1])
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    if not rate:
        with transaction.atomic(), connection.cursor() as cursor:
            _enqueue(cursor, n)
        print(f"committed {time.time()}")  # bench/drain.py times the drain from here
        return
    for _ in range(n):
        started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cursor:
            _enqueue(cursor, 1)
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))


if __name__ == "__main__":
    main()
