"""Conformance suite for ``jobstate.tasks.JobstateBackend``: the backend and validation.

Ported from the behaviours Django's own tasks tests and django-tasks-db's tests
check for a database backend (enqueue, get_result, invalid tasks, options).
Running tasks (results, errors, priorities, queues, context, jobstate's state
changes, transactions) is in test_tasks_running.py. The worker there is
``jobstate.worker.runner.drain`` (the code qcluster workers run, inline);
``tests/e2e/test_e2e_tasks.py`` runs the same tasks under a real qcluster.
"""

from __future__ import annotations

import copy
import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate import registry, services
from jobstate.models import Job, JobEvent
from jobstate.tasks import JobstateBackend, JobstateTask
from jobstate.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from jobstate.tasks.exceptions import OperatorFailed, TaskUnavailable
from jobstate.tasks.results import history, with_history
from jobstate.worker.runner import run_job
from tests.tasks_app import jobstate_tasks as jt
from tests.tasks_app import tasks as t
from tests.tasks_support import run_all

try:
    from django.tasks import default_task_backend, task
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:
    from django_tasks import default_task_backend, task  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultMismatch  # type: ignore[no-redef]

pytestmark = pytest.mark.django_db(transaction=True)


# -- the backend -------------------------------------------------------------------


def test_using_correct_backend():
    backend = task_backends["default"]
    assert default_task_backend == backend
    assert isinstance(backend, JobstateBackend)
    assert backend.alias == "default"
    assert backend.options == {}
    assert backend.queues == {"default", "emails"}
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert list(backend.check()) == []
    assert isinstance(t.noop_task, JobstateTask)


@pytest.mark.parametrize("name", ["noop_task", "noop_task_async", "noop_task_from_bare_decorator"])
def test_enqueue_task(name, enqueued_signal):
    the_task = getattr(t, name)
    result = the_task.enqueue(1, two=3)

    assert uuid.UUID(result.id).version == 7  # jobstate.ids: time-ordered
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == the_task
    assert result.args == [1] and result.kwargs == {"two": 3}
    assert result.attempts == 0 and result.errors == [] and result.worker_ids == []
    assert result.backend == "default"
    assert enqueued_signal == [(JobstateBackend, result)]

    job = Job.objects.get(pk=result.id)
    assert job.kind == f"tests.tasks_app.tasks.{name}"
    assert job.status == "queued"
    assert job.parameters == {"args": [1], "kwargs": {"two": 3}}
    assert result.enqueued_at == job.created_at
    assert list(job.events.values_list("transition", "actor_label")) == [("enqueue", "system:tasks:default")]


def test_aenqueue_and_aget_result(enqueued_signal):
    result = async_to_sync(t.noop_task_async.aenqueue)()
    assert result.status == TaskResultStatus.READY
    assert result.args == [] and result.kwargs == {}
    assert enqueued_signal == [(JobstateBackend, result)]
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result
    assert async_to_sync(t.noop_task_async.aget_result)(result.id) == result


def test_get_result_equals_the_enqueued_result():
    for result in [
        t.noop_task.enqueue(),
        t.echo.using(priority=7).enqueue("a", b=[1, 2]),
        t.noop_task.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(),
        t.send_email.enqueue("x@example.com"),
        jt.single_fails.enqueue(),
    ]:
        assert default_task_backend.get_result(result.id) == result
        assert result.task.get_result(result.id) == result


def test_get_result_equals_the_enqueued_result_with_non_string_dict_keys():
    result = t.echo.enqueue({1: "a"})
    assert result.args == [{"1": "a"}]  # as stored
    assert default_task_backend.get_result(result.id).args == result.args


def test_get_result_keeps_the_tasks_key_and_owner(user):
    keyed = t.noop_task.using(key="k1").enqueue()
    assert default_task_backend.get_result(keyed.id) == keyed
    owned = t.noop_task.using(owner=user).enqueue()
    assert default_task_backend.get_result(owned.id) == owned
    assert default_task_backend.get_result(owned.id).task.owner == user
    by_id = t.noop_task.using(owner=user.pk).enqueue()
    assert default_task_backend.get_result(by_id.id).task.owner == user


def test_enqueue_by_user_id_returns_the_owner_as_get_result_does(user):
    # The enqueue's result kept the id the task was given: not equal to get_result's.
    with CaptureQueriesContext(connection) as queries:
        by_id = t.noop_task.using(owner=user.pk).enqueue()
    assert by_id.task.owner == user
    assert default_task_backend.get_result(by_id.id) == by_id
    # One query for the user (the service checks the id), and none for a user given.
    assert len([q for q in queries if user._meta.db_table in q["sql"]]) == 1
    with CaptureQueriesContext(connection) as queries:
        owned = t.noop_task.using(owner=user).enqueue()
    assert owned.task.owner is user
    assert not [q for q in queries if user._meta.db_table in q["sql"]]


def test_get_result_of_a_job_that_is_not_a_task(temp_handler):
    temp_handler("plain.handler")
    job = services.enqueue("plain.handler", {})
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.pk))


def test_get_result_of_an_unknown_kind_starting_with_a_dot(temp_handler):
    temp_handler(".hidden.job")
    job = services.enqueue(".hidden.job", {})
    registry.unregister(".hidden.job")  # a process that does not register it
    with pytest.raises(TaskResultDoesNotExist):  # not importlib's TypeError
        default_task_backend.get_result(str(job.pk))


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        # The function renamed, its module removed, a kind= of its own dropped.
        ("tests.tasks_app.tasks.renamed_away", 'does not define a "renamed_away" attribute'),
        ("tests.tasks_app.gone.send", "module 'tests.tasks_app.gone' is not loaded in this process"),
        ("emails:welcome", "no task is registered under that kind"),
        ("tests.tasks_app.tasks.time", "tests.tasks_app.tasks.time is not a Task (a 'module' object)"),
    ],
)
def test_get_result_of_a_task_removed_from_the_code_says_so(temp_handler, kind, why):
    # Enqueued while the task existed; the code that registered it is gone since.
    temp_handler(kind)
    job = services.enqueue(kind, {"args": [1], "kwargs": {"b": 2}})
    registry.unregister(kind)
    for get in (default_task_backend.get_result, async_to_sync(default_task_backend.aget_result)):
        with pytest.raises(TaskUnavailable) as caught:  # the result exists: not TaskResultDoesNotExist
            get(str(job.pk))
        assert isinstance(caught.value, ImportError)  # as django-tasks-db raises it
        assert not isinstance(caught.value, TaskResultDoesNotExist)
        message = str(caught.value)
        assert f"Job {job.pk} exists, but its task {kind!r} is not found in this process" in message
        assert why in message and "renamed or removed from the code?" in message
        assert (caught.value.result_id, caught.value.kind) == (str(job.pk), kind)


def test_get_result_never_imports_the_module_a_job_kind_names(temp_handler):
    # The kind is stored data: get_result imported the module it names (running its
    # code in the web process) to find the task, then again to word the error.
    module = "tests.tasks_app.never_imported"
    kind = f"{module}.send"
    assert module not in sys.modules
    temp_handler(kind)
    job = services.enqueue(kind, {"args": [], "kwargs": {}})
    registry.unregister(kind)
    try:
        for get in (default_task_backend.get_result, async_to_sync(default_task_backend.aget_result)):
            with pytest.raises(TaskUnavailable) as caught:
                get(str(job.pk))
            assert module not in sys.modules
            message = str(caught.value)
            assert f"module {module!r} is not loaded in this process" in message
            assert "OPTIONS['MODULES']" in message and "renamed or removed from the code?" in message
    finally:
        sys.modules.pop(module, None)


def test_get_result_of_a_removed_plain_handler_job_has_no_task_result(temp_handler):
    temp_handler("plain.gone")
    job = services.enqueue("plain.gone", {"args": [1]})  # not the shape of a task call
    registry.unregister("plain.gone")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.pk))


def test_get_result_of_a_task_in_a_queue_registered_elsewhere():
    # QUEUES empty: the queue is named only in .using(queue_name=...), by the process that enqueued.
    result = jt.single_queue.using(queue_name="adhoc").enqueue()
    registry.unregister("adhoc:tests.tasks_app.jobstate_tasks.single_queue")  # as in another process
    assert task_backends["single"].get_result(result.id) == result


@pytest.mark.parametrize("result_id", ["70ee066b-1aec-46a8-84fc-2fe106240867", "123", ""])
def test_get_missing_or_invalid_result(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(result_id)


def test_task_result_mismatch():
    result = t.noop_task.enqueue()
    with pytest.raises(TaskResultMismatch):
        t.calculate_meaning_of_life.get_result(result.id)


def test_refresh_reads_the_worker_outcome():
    result = t.calculate_meaning_of_life.enqueue()
    assert run_all() == 1
    assert result.status == TaskResultStatus.READY  # the object is a snapshot
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1
    assert result.worker_ids == ["inline"]
    assert result.started_at >= result.enqueued_at
    assert result.last_attempted_at == result.started_at
    assert result.finished_at >= result.started_at
    assert result.errors == []
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def failed_once_the_first_statement_ran(job_id: str) -> Any:
    """An execute wrapper: an operator fails the job as soon as the first statement has
    run (between the reads of a TaskResult made of more than one)."""
    ran: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not ran:
            ran.append(sql)
            services.force_fail(job_id, actor="admin", reason="enough")
        return result

    return wrapper


def reserved() -> Any:
    """A task job a worker cluster reserved (claimed, not begun): its history is read."""
    result = t.noop_task.enqueue()
    services.claim("w", limit=1)
    return result


def retried() -> Any:
    """A task job on its second attempt, the first one failed: its history is read."""
    result = jt.flaky.enqueue("m")
    with transaction.atomic():  # one attempt only: the retry is due at once, so claim it by hand
        services.claim("w1", limit=1)
    run_job(Job.objects.get(pk=result.id), "w1")
    services.claim("w2", limit=1, start=True)
    return result


def read_by_refresh(result: Any) -> Any:
    result = copy.copy(result)
    result.refresh()
    return result


def read_by_arefresh(result: Any) -> Any:
    result = copy.copy(result)
    async_to_sync(result.arefresh)()
    return result


@pytest.mark.parametrize("job", [reserved, retried])
@pytest.mark.parametrize(
    "read",
    [
        lambda result: default_task_backend.get_result(result.id),
        lambda result: async_to_sync(default_task_backend.aget_result)(result.id),
        read_by_refresh,
        read_by_arefresh,
    ],
    ids=["get_result", "aget_result", "refresh", "arefresh"],
)
def test_a_task_result_is_one_committed_state_of_its_job(job, read):
    # Read in two statements, the job's status was from before the operator's fail and
    # its errors (from the history) from after: a result the job never had.
    result = job()
    before = default_task_backend.get_result(result.id)
    with connection.execute_wrapper(failed_once_the_first_statement_ran(result.id)):
        seen = read(result)
    after = default_task_backend.get_result(result.id)
    assert after.status == TaskResultStatus.FAILED and after.errors[-1].exception_class is OperatorFailed
    assert seen in (before, after)


def test_enqueue_returns_one_committed_state_of_the_job_it_found():
    first = jt.sync_account.enqueue(7)
    services.claim("w", limit=1)  # reserved: the job found again is read with its history

    def fail_before_the_history_is_read(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if JobEvent._meta.db_table in sql and sql.lstrip().upper().startswith("SELECT") and not failed:
            failed.append(services.force_fail(first.id, actor="admin", reason="enough"))
        return execute(sql, params, many, context)

    failed: list[Job] = []
    with connection.execute_wrapper(fail_before_the_history_is_read):
        again = jt.sync_account.enqueue(7)
    assert failed and again.id == first.id
    assert again == default_task_backend.get_result(first.id)
    assert again.status == TaskResultStatus.FAILED


@pytest.mark.parametrize("job", [reserved, retried])
def test_get_result_and_refresh_are_one_query_each(job):
    result = job()
    with CaptureQueriesContext(connection) as queries:
        default_task_backend.get_result(result.id)
        result.refresh()
    assert len(queries) == 2


@pytest.mark.parametrize("use_tz", [True, False])
def test_the_history_read_with_the_job_is_the_history_queried(settings, use_tz):
    # with_history reads the times as JSON text: naive or aware as Django reads the column.
    settings.USE_TZ, settings.TIME_ZONE = use_tz, "Asia/Kolkata"
    result = retried()
    read = history(with_history(Job.objects.filter(pk=result.id)).get())
    queried = history(Job.objects.get(pk=result.id))
    assert [row[0] for row in read] == ["enqueue", "claim", "requeue", "claim"]
    assert read[2][3]["error_type"] == "RuntimeError"
    assert read == queried
    assert all(timezone.is_aware(row[4]) is use_tz for row in read)


# -- validation --------------------------------------------------------------------


def test_validate_on_enqueue_queue_not_in_queues():
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        t.noop_task.using(queue_name="unknown_queue").enqueue()
    assert not Job.objects.exists()


def plain_function() -> None:
    """A module-level function the tests decorate with invalid options."""


def takes_no_context() -> None:
    pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be a whole number between 1 and 1000 (got 0)"),
        ({"max_attempts": 1.5}, "max_attempts must be a whole number between 1 and 1000 (got 1.5)"),
        ({"max_attempts": True}, "max_attempts must be a whole number between 1 and 1000 (got True)"),
        ({"max_attempts": float("inf")}, "max_attempts must be a whole number between 1 and 1000 (got inf)"),
        ({"max_attempts": float("nan")}, "max_attempts must be a whole number between 1 and 1000 (got nan)"),
        ({"timeout": 0}, "timeout must be a positive number of seconds (got 0)"),
        ({"timeout": float("nan")}, "timeout must be a positive number of seconds (got nan)"),
        ({"timeout": "10"}, "timeout must be a positive number of seconds (got '10')"),
        ({"concurrency": 0}, "concurrency must be a whole number of at least 1 (got 0)"),
        ({"concurrency": float("inf")}, "concurrency must be a whole number of at least 1 (got inf)"),
        ({"concurrency": float("nan")}, "concurrency must be a whole number of at least 1 (got nan)"),
        ({"retry_backoff": -1}, "retry_backoff must be a number of seconds >= 0"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a number of seconds >= 0"),
        ({"key": ""}, "key must be a non-empty string of at most 255 characters"),
        ({"key": 5}, "key must be a non-empty string"),
        ({"key": "   "}, "not only whitespace"),
        ({"key": "a\x00b"}, "no NUL character or lone surrogate"),
        ({"key": "a\ud800"}, "no NUL character or lone surrogate"),
        ({"kind": ""}, "kind must be a non-empty string"),
        ({"kind": "x" * 201}, "longer than 200 characters"),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"priority": -101}, "priority must be a whole number between -100 and 100"),
        ({"priority": 1.0}, "priority must be a whole number between -100 and 100 (got 1.0)"),
        ({"priority": True}, "priority must be a whole number between -100 and 100 (got True)"),
        ({"priority": "1"}, "priority must be a whole number between -100 and 100 (got '1')"),
        ({"queue_name": "nope"}, "Queue 'nope' is not valid for backend"),
        ({"takes_context": True}, "Task takes context but does not have a first argument of 'context'"),
    ],
)
def test_invalid_task_options(options, message):
    with pytest.raises(InvalidTask) as info:
        task(**options)(plain_function)
    assert message in str(info.value)
    assert "tests.test_tasks_backend.plain_function" not in registry.all_handlers()


def test_invalid_tasks_from_django_tests():
    def local_function() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task()(local_function)
    with pytest.raises(InvalidTask, match="module level"):
        task()(print)
    with pytest.raises(InvalidTask, match="aware datetime"):
        t.noop_task.using(run_after=timezone.now().replace(tzinfo=None))


@pytest.mark.parametrize("run_after", [timedelta(hours=1), "2030-01-01T00:00:00+00:00", 1_900_000_000])
def test_a_run_after_that_is_no_datetime_is_an_invalid_task(run_after):
    # It raised AttributeError from the checks (a timedelta has no utcoffset()).
    with pytest.raises(InvalidTask, match="run_after must be a datetime"):
        t.noop_task.using(run_after=run_after)


@pytest.mark.parametrize("priority", [1.0, True, "1"])
def test_a_priority_that_is_no_whole_number_is_refused_by_using(priority):
    # It passed Django's range check and failed at enqueue as a database error
    # (1.0, True) or a TypeError ("1"), with nothing saying which option was wrong.
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        t.noop_task.using(priority=priority)
    assert not Job.objects.exists()


def max_attempts_given_as_a_float() -> None:
    pass


def test_a_whole_float_max_attempts_is_enqueued():
    # Accepted as a whole number by the task's validation, then refused at every
    # enqueue as a ValidationError (the service takes an int).
    result = task(max_attempts=5.0)(max_attempts_given_as_a_float).enqueue()
    assert Job.objects.get(pk=result.id).max_attempts == 5


def test_kind_taken_by_a_handler_is_refused(temp_handler):
    temp_handler("taken.kind")
    with pytest.raises(InvalidTask, match=r"'taken\.kind' is already registered"):
        task(kind="taken.kind")(plain_function)
    assert registry.get_handler("taken.kind").func.__name__ == "<lambda>"


def test_arguments_must_be_json():
    with pytest.raises(TypeError):
        t.noop_task.enqueue(timezone.now())
    with pytest.raises(TypeError):
        t.noop_task.enqueue(x=object())
    assert not Job.objects.exists()


def test_oversized_arguments_are_refused_by_the_service_layer():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="the limit is"):
        t.noop_task.enqueue("x" * 70_000)


def test_good_options_reach_the_registry():
    spec = registry.get_handler("tests.tasks_app.jobstate_tasks.too_slow")
    assert (spec.timeout, spec.max_attempts) == (0.5, 1)
    assert registry.concurrency_limits()["tests.tasks_app.jobstate_tasks.limited"] == 1
    assert registry.get_handler("tests.tasks_app.jobstate_tasks.flaky").retry_backoff == 0
    assert registry.get_handler("reports.progress").func.jobstate_task is jt.with_progress


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": float("inf")},
        {"max_attempts": float("nan")},
        {"concurrency": float("inf")},
        {"concurrency": float("nan")},
        {"retry_backoff": float("nan")},
    ],
)
def test_the_registry_refuses_non_finite_options(temp_handler, options):
    with pytest.raises(ValueError, match=r"(must be|is) a"):
        temp_handler("test.non_finite", **options)
