"""Prometheus metrics for jobstate: ``jobstate.metrics.urls`` serves ``metrics/``.

See ``docs/howto/metrics.md`` for what is exported and how the counters stay
correct across worker processes and restarts (they are derived from the job
history, not counted in memory).
"""


def install() -> None:
    from jobstate.metrics import checks, models  # noqa: F401  (registers the check and MetricTotal)
