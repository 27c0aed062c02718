"""``jobstate.tasks.task``: Django's ``@task`` with jobstate's options, typed
(what type checkers see of it: tests/typing/tasks_usage.py, run by ``make typecheck``)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from jobstate import registry
from jobstate.models import Job
from jobstate.tasks import JobstateTask, task
from jobstate.tasks.compat import InvalidTask, TaskResultStatus
from tests.tasks_app import jobstate_tasks as jt
from tests.tasks_support import run_all

pytestmark = pytest.mark.django_db(transaction=True)


def plain(n: int) -> int:
    return n


def test_options_reach_the_task_and_the_registry():
    assert isinstance(jt.typed_keyed, JobstateTask)
    assert (jt.typed_keyed.max_attempts, jt.typed_keyed.retry_backoff) == (2, 0)
    spec = registry.get_handler("typed.keyed")
    assert (spec.max_attempts, spec.retry_backoff) == (2, 0)
    context_kind = "tests.tasks_app.jobstate_tasks.typed_context"
    assert registry.get_handler(context_kind).timeout == 30
    assert registry.concurrency_limits()[context_kind] == 3


def test_a_keyed_task_runs_retries_and_keeps_its_key():
    first = jt.typed_keyed.enqueue(4)
    assert jt.typed_keyed.enqueue(4).id == first.id  # the key: one active job
    run_all()
    first.refresh()
    assert first.status == TaskResultStatus.SUCCESSFUL
    assert first.return_value == 8
    job = Job.objects.get(pk=first.id)
    assert (job.key, job.attempts) == ("typed-4", 2)


def test_using_sets_the_owner_and_key():
    user = get_user_model().objects.create_user("typed-owner")
    result = jt.typed_bare.using(owner=user, key="mine", priority=5).enqueue(1)
    job = Job.objects.get(pk=result.id)
    assert (job.owner_id, job.key, job.priority) == (user.pk, "mine", 5)
    run_all()
    result.refresh()
    assert result.return_value == 2


def test_context_task_reports_progress():
    result = jt.typed_context.enqueue(10)
    run_all()
    result.refresh()
    assert result.return_value == 11
    job = Job.objects.get(pk=result.id)
    assert (job.progress, job.progress_message) == (100, "half way")  # complete: 100 %, the last message


def test_options_left_at_none_keep_their_defaults():
    made = task(priority=None, queue_name=None, backend=None, max_attempts=None, key=None)(plain)
    defaults = (made.priority, made.queue_name, made.backend, made.max_attempts)
    assert defaults == (0, "default", "default", None)
    assert made.enqueue(3).id


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be a whole number between 1 and 1000 (got 0)"),
        ({"timeout": -1}, "timeout must be a positive number of seconds"),
        ({"priority": 500}, "priority must be a whole number between -100 and 100"),
    ],
)
def test_bad_options_are_refused_as_djangos_decorator_refuses_them(options, message):
    with pytest.raises(InvalidTask) as info:
        task(**options)(plain)
    assert message in str(info.value)


def test_a_backend_that_is_not_jobstates_is_refused():
    # Its Task takes no jobstate option: .using(owner=...) failed at runtime (a
    # TypeError), and jobstate's options a TypeError from Task itself.
    with pytest.raises(InvalidTask, match=r"needs a jobstate backend; 'dummy' is .*DummyBackend"):
        task(backend="dummy")(plain)
    with pytest.raises(InvalidTask, match="needs a jobstate backend"):
        task(backend="dummy", max_attempts=3)(plain)
    assert isinstance(task(backend="single")(plain), JobstateTask)
