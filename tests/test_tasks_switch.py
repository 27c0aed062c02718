"""The test project was written for django-tasks-db: switching it to jobstate
changes ``TASKS["default"]["BACKEND"]`` alone (plus INSTALLED_APPS), and its
tasks module uses Django's tasks API only (tests/e2e/test_e2e_tasks.py runs it
under a real qcluster)."""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

from tests.tasks_app import settings as project_tasks


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
