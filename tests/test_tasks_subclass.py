"""A subclass of ``JobstateBackend`` configured in ``TASKS``: Django sends the tasks
framework's signals with the configured backend's class as the sender."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobstate import hooks
from jobstate.tasks import JobstateBackend
from jobstate.tasks.compat import TaskResultStatus
from jobstate.tasks.handlers import on_transition
from tests.tasks_app import tasks as t
from tests.tasks_support import run_all

pytestmark = pytest.mark.django_db(transaction=True)


class SubBackend(JobstateBackend):
    """A project's own backend, built on jobstate's."""


@pytest.fixture(name="sub_backend")
def sub_backend_fixture(settings):  # type: ignore[no-untyped-def]
    settings.TASKS = {
        **settings.TASKS,
        "sub": {"BACKEND": f"{__name__}.SubBackend", "OPTIONS": {"MAX_ATTEMPTS": 1}},
    }


def test_the_signals_name_the_subclass_as_their_sender(sub_backend, enqueued_signal, worker_signals):
    started, finished = worker_signals
    ok = t.calculate_meaning_of_life.using(backend="sub").enqueue()
    failed = t.failing_task_value_error.using(backend="sub").enqueue()
    run_all()
    assert [(sender, r.id) for sender, r in enqueued_signal] == [(SubBackend, ok.id), (SubBackend, failed.id)]
    # task_started and task_finished named JobstateBackend, whatever the configured class.
    assert [(sender, r.id) for sender, r in started] == [(SubBackend, ok.id), (SubBackend, failed.id)]
    assert [(sender, r.id, r.status) for sender, r in finished] == [
        (SubBackend, ok.id, TaskResultStatus.SUCCESSFUL),
        (SubBackend, failed.id, TaskResultStatus.FAILED),
    ]


def test_a_job_of_a_backend_no_longer_configured_is_sent_by_jobstates_class(
    settings, sub_backend, worker_signals
):
    started, finished = worker_signals
    result = t.calculate_meaning_of_life.using(backend="sub").enqueue()
    # The alias left TASKS before a worker ran the job: its task still runs.
    settings.TASKS = {alias: config for alias, config in settings.TASKS.items() if alias != "sub"}
    run_all()
    assert [sender for sender, _r in started + finished] == [JobstateBackend, JobstateBackend]
    assert finished[0][1].id == result.id and finished[0][1].return_value == 42


def test_a_subclass_alone_in_tasks_is_set_up_at_startup(settings, worker_signals):
    # install() and the checks knew a jobstate backend by its BACKEND path only
    # ("jobstate.tasks..."): with a subclass alone, no task_finished was ever sent,
    # no app's tasks module or OPTIONS["MODULES"] was imported (workers never ran the
    # tasks), and on Django 5.2 the backend's checks did not run.
    import jobstate.tasks

    _started, finished = worker_signals
    hooks.transitioned.unregister(on_transition)  # as in a process that never installed it
    try:
        settings.TASKS = {
            "default": {"BACKEND": f"{__name__}.SubBackend", "QUEUES": ["default", "emails"]},
            "missing": {"BACKEND": "tests.no_such_module.Backend"},  # Django's error, when used
        }
        assert jobstate.tasks.configured_aliases() == ["default"]
        jobstate.tasks.install()
        result = t.calculate_meaning_of_life.enqueue()
        run_all()
        assert [(sender, r.id, r.return_value) for sender, r in finished] == [(SubBackend, result.id, 42)]
        modules = {"MODULES": ["myproject.tasks"]}
        settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": modules}}
        with pytest.raises(ImproperlyConfigured, match=r"names 'myproject\.tasks', which cannot be imported"):
            jobstate.tasks.install()
    finally:
        hooks.transitioned.register(on_transition, writes=lambda change: False)
