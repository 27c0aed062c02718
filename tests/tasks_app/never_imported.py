"""A module no code imports: the job kind "tests.tasks_app.never_imported.send" names
it, and get_result of such a job must not import it (tests/test_tasks_backend.py
looks for it in sys.modules)."""

from __future__ import annotations

from tests.tasks_app.tasks import noop_task as send

__all__ = ["send"]
