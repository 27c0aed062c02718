"""The test project as it was before the switch: ``tests.tasks_app`` under
django-tasks-db, the backend it was written for (``DJANGO_TASKS_DB`` in
tests/tasks_app/settings.py; ``"django_tasks_db"`` installed, jobstate not).

``python -m tests.tasks_app.under_tasks_db DATABASE`` (a new SQLite file) migrates,
enqueues ``CALLS`` through Django's tasks API, runs django-tasks-db's own worker
until the queue is empty (``db_worker --batch``) and prints each result's
``outcome`` as JSON. tests/test_tasks_switch.py compares it with the same calls
run through jobstate's backend. Importing this module changes no settings.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# (task name in tests.tasks_app.tasks, args, kwargs): the calls both runs make.
CALLS: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("calculate_meaning_of_life", [], {}),
    ("echo", [1, "two"], {"three": [3]}),
    ("async_echo", ["a"], {"b": None}),
    ("test_context", [1], {}),
    ("get_task_id", [], {}),
    ("send_email", ["x@example.com"], {}),
    ("failing_task_value_error", [], {}),
    ("failing_task_custom_error", [], {}),
    ("complex_return_value", [], {}),
]


def enqueue_all() -> list[Any]:
    """Enqueue ``CALLS`` through the configured default backend; their results."""
    from tests.tasks_app import tasks

    return [getattr(tasks, name).enqueue(*args, **kwargs) for name, args, kwargs in CALLS]


def outcome(result: Any) -> dict[str, Any]:
    """What a result says, backend-neutral (the result's own id shows as "<own id>")."""
    value = result.return_value if result.status == "SUCCESSFUL" else None
    value = json.loads(json.dumps(value).replace(json.dumps(result.id)[1:-1], "<own id>"))
    return {
        "task": result.task.module_path,
        "queue": result.task.queue_name,
        "args": result.args,
        "kwargs": result.kwargs,
        "status": str(result.status),
        "finished": result.is_finished,
        "return_value": value,
        "errors": [error.exception_class_path for error in result.errors],
        "timed": None not in (result.started_at, result.finished_at)
        and result.enqueued_at <= result.started_at <= result.finished_at,
    }


def main(database: str) -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    from tests.tasks_app.settings import DJANGO_TASKS_DB

    settings.configure(
        INSTALLED_APPS=["django_tasks_db", "tests.tasks_app"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database}},
        TASKS=DJANGO_TASKS_DB,
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    call_command("migrate", verbosity=0)
    results = enqueue_all()
    call_command(
        "db_worker", batch=True, queue_name="*", interval=0, startup_delay=False, reload=False, verbosity=0
    )
    for result in results:
        result.refresh()
    print(json.dumps([outcome(result) for result in results]))


if __name__ == "__main__":
    main(sys.argv[1])
