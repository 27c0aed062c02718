"""Settings for the test suite: the demo settings plus the ``tests`` app, whose
``jobs.py`` registers the handlers tests use (worker subprocesses load them too)."""

import json
import os

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, JOBSTATE, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "tests"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# End-to-end tests start real qcluster processes with short leases and timeouts:
# they pass overrides as JSON in the environment (see tests/e2e/support.py).
JOBSTATE = {**JOBSTATE, **json.loads(os.environ.get("JOBSTATE_OVERRIDES") or "{}")}
Q_CLUSTER = {**Q_CLUSTER, **json.loads(os.environ.get("Q_CLUSTER_OVERRIDES") or "{}")}

# django.tasks on jobstate (jobstate.tasks): a project app written for django-tasks-db.
from tests.tasks_app.settings import TASKS  # noqa: E402, F401

INSTALLED_APPS = [*INSTALLED_APPS, "tests.tasks_app"]
