"""The benchmark task for procrastinate's Django contrib (autodiscovered when
``BENCH_MODE=procrastinate``)."""

from procrastinate.contrib.django import app

from bench.tasks import plain_job as _plain_job


@app.task(name="bench.plain_job")
def plain_job(row_id: int) -> None:
    _plain_job(row_id)
