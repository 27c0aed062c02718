"""Settings for bench/drain.py's worker clusters: the demo settings plus the
``bench`` app (its handler), a PostgreSQL database of its own, and a Q_CLUSTER
chosen by ``BENCH_MODE``: ``jobstate`` (the Job table as broker), ``plain``
(django-q2 defaults on its ORM broker) or ``tuned`` (bulk 10, poll 0.05,
save_limit 0)."""

import json
import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, JOBSTATE, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("BENCH_CONN_MAX_AGE", "0"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
MODE = os.environ.get("BENCH_MODE", "jobstate")
if MODE == "jobstate":
    Q_CLUSTER = {**Q_CLUSTER, "name": "bench", "workers": WORKERS}
elif MODE == "plain":
    Q_CLUSTER = {"name": "bench", "orm": "default", "workers": WORKERS}
elif MODE == "tuned":
    Q_CLUSTER = {
        "name": "bench",
        "orm": "default",
        "workers": WORKERS,
        "bulk": 10,
        "poll": 0.05,
        "save_limit": 0,
    }
else:
    raise ValueError(f"BENCH_MODE {MODE!r}")
JOBSTATE = {**JOBSTATE, **json.loads(os.environ.get("BENCH_JOBSTATE") or "{}")}
LOGGING = {"version": 1, "disable_existing_loggers": False}
SILENCED_SYSTEM_CHECKS = ["jobstate.W001", "jobstate.W002", "jobstate.W003", "jobstate.W004"]
