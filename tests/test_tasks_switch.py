"""The test project was written for django-tasks-db: switching it to jobstate
changes ``TASKS["default"]["BACKEND"]`` alone (plus INSTALLED_APPS), and its
tasks module uses Django's tasks API only. Its tasks run under django-tasks-db
(where it is installed: the Django 6 venv) and give the same results through
jobstate's backend (tests/e2e/test_e2e_tasks.py runs them under a real qcluster)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobstate.models import Job
from jobstate.worker.runner import drain
from tests.tasks_app import settings as project_tasks
from tests.tasks_app.under_tasks_db import CALLS, enqueue_all, outcome

ROOT = Path(__file__).resolve().parent.parent


def test_only_the_backend_changes():
    before = project_tasks.DJANGO_TASKS_DB["default"]
    after = settings.TASKS["default"]
    assert before["BACKEND"] == "django_tasks_db.DatabaseBackend"
    assert after["BACKEND"] == "jobstate.tasks.JobstateBackend"
    assert {k: v for k, v in after.items() if k != "BACKEND"} == {
        k: v for k, v in before.items() if k != "BACKEND"
    }
    assert "jobstate" in settings.INSTALLED_APPS and "django_q" in settings.INSTALLED_APPS
    assert "django_tasks_db" not in settings.INSTALLED_APPS


def test_the_project_tasks_use_the_django_tasks_api_only():
    source = (Path(project_tasks.__file__).parent / "tasks.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert imported <= {"__future__", "time", "typing", "django.tasks", "django_tasks"}


@pytest.mark.django_db(transaction=True)
def test_the_project_runs_the_same_under_django_tasks_db_and_jobstate(settings, tmp_path):
    if importlib.util.find_spec("django_tasks_db") is None:
        pytest.skip(
            "django-tasks-db is not installed: requirements-dev.txt installs it only on Python "
            "3.12+ (the Django 6 venv), so the project's run before the switch is not shown here"
        )
    # Before the switch: the project as written for django-tasks-db (jobstate not installed),
    # its tasks run by django-tasks-db's own worker, in a process of its own.
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    command = [sys.executable, "-m", "tests.tasks_app.under_tasks_db", str(tmp_path / "tasks_db.sqlite3")]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    before = json.loads(run.stdout)
    assert [o["status"] for o in before] == ["SUCCESSFUL"] * 6 + ["FAILED"] * 3
    assert before[-3]["errors"] == ["builtins.ValueError"]

    # After: the same calls through jobstate's backend, run by jobstate's worker code. A
    # failure is final here as under django-tasks-db: the migration guide's MAX_ATTEMPTS 1.
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 1}},
    }
    results = enqueue_all()
    assert Job.objects.count() == len(CALLS)
    assert drain("inline") == len(CALLS)
    for result in results:
        result.refresh()
    # One difference, documented: a return value that is not JSON is django-tasks-db's
    # TypeError, jobstate's UnstorableResult (a NonRetryable: the task is not run again).
    assert before[-1]["task"].endswith(".complex_return_value")
    assert before[-1]["errors"] == ["builtins.TypeError"]
    before[-1]["errors"] = ["jobstate.tasks.exceptions.UnstorableResult"]
    assert [outcome(result) for result in results] == before
