"""Shared by the tests of the django.tasks backend (test_tasks_backend.py, test_tasks_running.py)."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate.tasks.compat import task_enqueued, task_finished, task_started
from jobstate.worker.runner import drain


def run_all(**kwargs: Any) -> int:
    """Run every ready task inline (the code qcluster workers run)."""
    return drain("inline", **kwargs)


class Capture:
    def __init__(self) -> None:
        self.received: list[tuple[Any, Any]] = []

    def __call__(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        self.received.append((sender, task_result))


# Registered under the names the tests ask for (tests/conftest.py loads this module).
@pytest.fixture(name="enqueued_signal")
def enqueued_signal_fixture():  # type: ignore[no-untyped-def]
    capture = Capture()
    task_enqueued.connect(capture, dispatch_uid="jobstate_tasks_test", weak=False)
    yield capture.received
    task_enqueued.disconnect(dispatch_uid="jobstate_tasks_test")


@pytest.fixture(name="worker_signals")
def worker_signals_fixture():  # type: ignore[no-untyped-def]
    started, finished = Capture(), Capture()
    task_started.connect(started, dispatch_uid="jobstate_tasks_started", weak=False)
    task_finished.connect(finished, dispatch_uid="jobstate_tasks_finished", weak=False)
    yield started.received, finished.received
    task_started.disconnect(dispatch_uid="jobstate_tasks_started")
    task_finished.disconnect(dispatch_uid="jobstate_tasks_finished")
