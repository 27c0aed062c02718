"""End to end: the test project's ``@task`` functions (written for django-tasks-db,
see tests/tasks_app/settings.py) run under a real ``manage.py qcluster`` through
``jobstate.tasks.JobstateBackend``, show in the admin with their history, and
``get_result`` follows a cancel from the admin and a rescue by the reaper."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.urls import reverse

from jobstate.models import Job
from jobstate.tasks.compat import TaskResultStatus
from jobstate.tasks.exceptions import WorkerLost
from tests.e2e.support import wait_for, worker_pid
from tests.tasks_app import jobstate_tasks as jt
from tests.tasks_app import tasks as t

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def refreshed(result: Any) -> Any:
    result.refresh()
    return result


def finished(result: Any) -> Any:
    return refreshed(result).is_finished and result


def running_in_worker(result: Any) -> Any:
    """Running in a worker process (``<host>:<cluster pid>:<worker pid>``), not just claimed."""
    refreshed(result)
    ids = result.worker_ids
    return result.status == TaskResultStatus.RUNNING and ids and ids[-1].count(":") == 2 and result


def test_tasks_run_end_to_end_and_show_in_the_admin(qcluster, admin_client):
    cluster = qcluster(workers=2)
    results = [
        t.echo.enqueue(1, two=2),
        t.async_echo.enqueue("a"),
        t.test_context.enqueue(1),
        t.send_email.enqueue("x@example.com"),
        t.failing_task_value_error.using(backend="single").enqueue(),
        jt.flaky.enqueue("e2e"),
    ]
    for result in results:
        wait_for(lambda result=result: finished(result), 20, message=cluster.log()[-3000:])
    echo, async_echo, context, email, failing, flaky = results
    assert echo.status == TaskResultStatus.SUCCESSFUL, echo.errors
    assert echo.return_value == {"args": [1], "kwargs": {"two": 2}}
    assert async_echo.return_value == {"args": ["a"], "kwargs": {}}
    assert context.return_value == {"attempt": 1, "id": context.id}
    assert email.return_value == "sent to x@example.com"
    assert failing.status == TaskResultStatus.FAILED
    assert failing.errors[0].exception_class is ValueError
    assert flaky.status == TaskResultStatus.SUCCESSFUL and flaky.attempts == 2
    assert flaky.errors[0].exception_class is RuntimeError
    for result in results:
        _host, cluster_pid, pid = result.worker_ids[-1].split(":")
        assert int(cluster_pid) == cluster.pid and int(pid) != cluster.pid
        assert result.started_at >= result.enqueued_at and result.finished_at >= result.last_attempted_at

    job = Job.objects.get(pk=echo.id)
    assert list(job.events.values_list("transition", flat=True)) == ["enqueue", "claim", "complete"]
    page = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert "tests.tasks_app.tasks.echo" in page
    for transition in ("enqueue", "claim", "complete"):
        assert transition in page
    listing = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    assert "emails:tests.tasks_app.tasks.send_email" in listing


def test_cancel_from_the_admin_is_seen_by_get_result(qcluster, admin_client):
    cluster = qcluster(workers=1)
    result = jt.cancellable.enqueue(30)
    wait_for(lambda: running_in_worker(result), 15, message=cluster.log()[-3000:])
    url = reverse("admin:jobstate_job_transition", args=[result.id, "cancel"])
    assert admin_client.post(url, {"reason": "operator said stop"}).status_code == 302

    wait_for(lambda: finished(result), 15, message=cluster.log()[-3000:])
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "jobstate.exceptions.CancelRequested"
    transitions = list(Job.objects.get(pk=result.id).events.values_list("transition", "actor_label"))
    assert transitions[-2] == ("request_cancel", "admin")
    assert transitions[-1][0] == "cancel"


def test_rescue_by_the_reaper_is_seen_by_get_result(qcluster):
    cluster = qcluster(workers=2)
    result = jt.sleeper.enqueue(3)
    running = wait_for(lambda: running_in_worker(result), 15, message=cluster.log()[-3000:])
    victim = worker_pid(running.worker_ids[-1])
    cluster.kill(victim, signal.SIGKILL)

    wait_for(lambda: refreshed(result).errors, 20, message=cluster.log()[-3000:])
    assert result.errors[0].exception_class is WorkerLost
    assert result.status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)
    wait_for(lambda: finished(result), 20, message=cluster.log()[-3000:])
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 2 and worker_pid(result.worker_ids[1]) != victim
