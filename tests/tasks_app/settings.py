"""The test project's ``TASKS``, as written for django-tasks-db, switched to jobstate.

The project was written for django-tasks-db (``DJANGO_TASKS_DB`` below, with
``"django_tasks_db"`` in INSTALLED_APPS). Switching it to jobstate changes
``TASKS["default"]["BACKEND"]`` alone (and INSTALLED_APPS: ``"jobstate"`` and
``"django_q"`` instead of ``"django_tasks_db"``); ``tests/test_tasks_switch.py``
checks that nothing else differs. The other aliases serve the conformance suite
(multiple backends).
"""

from __future__ import annotations

import django

DJANGO_TASKS_DB = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "emails"]},
}

TASKS = {
    **DJANGO_TASKS_DB,
    "default": {**DJANGO_TASKS_DB["default"], "BACKEND": "jobstate.tasks.JobstateBackend"},
    # A second jobstate backend: no retries, any queue name, jobstate-only tasks module.
    "single": {
        "BACKEND": "jobstate.tasks.JobstateBackend",
        "QUEUES": [],
        "OPTIONS": {"MAX_ATTEMPTS": 1, "MODULES": ["tests.tasks_app.jobstate_tasks"]},
    },
    "dummy": {
        "BACKEND": (
            "django.tasks.backends.dummy.DummyBackend"
            if django.VERSION >= (6, 0)
            else "django_tasks.backends.dummy.DummyBackend"
        )
    },
}
