"""Settings for bench/drain.py's worker processes: the demo settings plus the
``bench`` app (its handler), a database of its own, every process with the same
``CONN_MAX_AGE`` (``BENCH_CONN_MAX_AGE``, default None: persistent connections),
and the system chosen by ``BENCH_MODE``:

- ``jobstate``: the Job table as django-q2's broker (the README's Q_CLUSTER);
- ``q2``: plain django-q2 on its ORM broker, defaults;
- ``q2tuned``: plain django-q2, ``bulk`` 10, ``poll`` 0.05, ``save_limit`` 0;
- ``procrastinate``: procrastinate's Django contrib.
"""

import json
import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, JOBSTATE, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
# As in production, and as bench/settings_tasksdb.py: with DEBUG on, Django logs
# every query of every Django-based system (jobstate, django-q2) in memory.
DEBUG = False
_age = os.environ.get("BENCH_CONN_MAX_AGE", "none").lower()
DATABASES["default"]["CONN_MAX_AGE"] = None if _age in ("", "none") else int(_age)
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
MODE = os.environ.get("BENCH_MODE", "jobstate")
if MODE == "jobstate":
    Q_CLUSTER = {**Q_CLUSTER, "name": "bench", "workers": WORKERS}
    if os.environ.get("BENCH_BROKER"):
        Q_CLUSTER["broker_class"] = os.environ["BENCH_BROKER"]
elif MODE == "q2":
    Q_CLUSTER = {"name": "bench", "orm": "default", "workers": WORKERS}
elif MODE == "q2tuned":
    Q_CLUSTER = {
        "name": "bench",
        "orm": "default",
        "workers": WORKERS,
        "bulk": 10,
        "poll": 0.05,
        "save_limit": 0,
    }
elif MODE == "procrastinate":
    INSTALLED_APPS = [*INSTALLED_APPS, "procrastinate.contrib.django"]
    # bench/drain.py itself runs in this mode: its async_task calls go to the plain clusters.
    Q_CLUSTER = {"name": "bench", "orm": "default", "workers": WORKERS}
    PROCRASTINATE_AUTODISCOVER_MODULE_NAME = "procrastinate_tasks"
else:
    raise ValueError(f"BENCH_MODE {MODE!r}")
JOBSTATE = {**JOBSTATE, **json.loads(os.environ.get("BENCH_JOBSTATE") or "{}")}
LOGGING = {"version": 1, "disable_existing_loggers": False}
SILENCED_SYSTEM_CHECKS = ["jobstate.W001", "jobstate.W002", "jobstate.W003", "jobstate.W004"]
if os.environ.get("BENCH_NO_PREPARE"):
    # jobstate's statements unprepared (bench/drain.py's jobstate-noprep), as Django's default.
    DATABASES["default"].get("OPTIONS", {}).pop("prepare_threshold", None)
