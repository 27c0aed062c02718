"""Prometheus metrics for jobstate: ``jobstate.metrics.urls`` serves ``metrics/``.

See ``docs/howto/metrics.md`` for what is exported and how the counters stay
correct across worker processes and restarts (they are derived from the job
history, not counted in memory).
"""


def install() -> None:
    from jobstate import hooks
    from jobstate.metrics import checks, models, totals  # noqa: F401  (registers the check and MetricTotal)

    # Retention folds the history it is about to delete into the counters first.
    hooks.history_pruning.register(totals.catch_up)
    hooks.history_reach.register(totals.reach)  # and a dry run counts as that would leave
