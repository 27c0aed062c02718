"""Settings for bench/tasks_drain.py's clusters: bench/settings.py (jobstate mode)
plus a ``django.tasks`` backend on jobstate whose task module is
bench/tasks_drain_jobs.py."""

from bench.settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "jobstate.tasks.JobstateBackend",
        "OPTIONS": {"MODULES": ["bench.tasks_drain_jobs"]},
    }
}
