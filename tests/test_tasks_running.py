"""Conformance suite for ``jobstate.tasks.JobstateBackend``: running tasks.

Results, errors and statuses, priorities and defer, queues and backends,
the task context, jobstate's state changes seen through ``get_result``
(history, retries, cancel, rescue) and transactions. The worker is
``jobstate.worker.runner.drain`` (the code qcluster workers run, inline);
``tests/e2e/test_e2e_tasks.py`` runs the same tasks under a real qcluster.
The backend itself and validation: test_tasks_backend.py.
"""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import OperationalError, transaction
from django.utils import timezone

from jobstate import hooks, registry, services
from jobstate.exceptions import CancelRequested, NonRetryable, Partial
from jobstate.models import Asset, Job, JobEvent
from jobstate.tasks import JobstateBackend, current, enqueue_on_commit
from jobstate.tasks.compat import (
    InvalidTask,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from jobstate.tasks.exceptions import (
    OperatorFailed,
    OperatorRequeued,
    TaskTimeout,
    UnstorableResult,
    WorkerLost,
)
from jobstate.tasks.results import exception_path, started_result, status_of
from jobstate.worker import runner
from jobstate.worker.runner import run_job
from tests.tasks_app import jobstate_tasks as jt
from tests.tasks_app import tasks as t
from tests.tasks_support import run_all

try:
    from django.tasks import default_task_backend, task
except ImportError:
    from django_tasks import default_task_backend, task  # type: ignore[no-redef]

pytestmark = pytest.mark.django_db(transaction=True)


# -- running: results, errors, statuses --------------------------------------------


def test_run_sync_and_async_tasks():
    results = [
        t.echo.enqueue(1, "two", three=[3]),
        t.async_echo.enqueue(1, "two", three=[3]),
        t.noop_task_async.enqueue(),
    ]
    assert run_all() == 3
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert results[0].return_value == {"args": [1, "two"], "kwargs": {"three": [3]}}
    assert results[1].return_value == results[0].return_value
    assert results[2].return_value is None


def test_failing_task_without_retries():
    result = t.failing_task_value_error.using(backend="single").enqueue()
    assert result.backend == "single"
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.started_at >= result.enqueued_at and result.finished_at >= result.started_at
    assert len(result.errors) == 1
    assert result.errors[0].exception_class_path == "builtins.ValueError"
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback.endswith("ValueError: This task failed due to ValueError\n")
    assert Job.objects.get(pk=result.id).max_attempts == 1


def test_failing_task_retries_then_fails_with_one_error_per_attempt():
    result = jt.always_fails.enqueue()
    assert run_all() == 3
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3 and result.worker_ids == ["inline"] * 3
    assert [e.exception_class for e in result.errors] == [KeyError] * 3
    assert all(e.traceback.endswith("KeyError: 'missing'\n") for e in result.errors)
    assert result.last_attempted_at > result.started_at


def test_a_retry_is_ready_with_the_first_error():
    result = jt.flaky.enqueue("m")
    with transaction.atomic():  # one attempt only: the retry is due at once, so claim it by hand
        services.claim("w1", limit=1)
    job = Job.objects.get(pk=result.id)
    run_job(job, "w1")
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1 and result.worker_ids == ["w1"]
    assert result.errors[0].exception_class is RuntimeError
    assert "first attempt of m fails" in result.errors[0].traceback
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "tests.tasks_app.jobstate_tasks.flaky"
    assert result.worker_ids == ["w1", "inline"]
    assert len(result.errors) == 1  # earlier attempts' errors stay on a successful result


def test_custom_and_complex_exceptions():
    custom = t.failing_task_custom_error.using(backend="single").enqueue()
    complex_ = t.complex_exception.using(backend="single").enqueue()
    run_all()
    custom.refresh()
    complex_.refresh()
    assert custom.errors[0].exception_class_path == "tests.tasks_app.tasks.CustomError"
    assert custom.errors[0].exception_class is t.CustomError
    assert complex_.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in complex_.errors[0].traceback


class LongMessageError(Exception):
    pass


@task(max_attempts=1)
def raises_a_long_message() -> None:
    raise LongMessageError("x" * 9000)


def test_exception_class_path_of_an_exception_with_a_long_message():
    result = raises_a_long_message.enqueue()
    run_all()
    result.refresh()
    assert result.errors[0].exception_class_path == f"{__name__}.LongMessageError"
    assert result.errors[0].exception_class is LongMessageError
    assert "raise LongMessageError" in result.errors[0].traceback  # the frames are kept


def test_complex_return_value_fails_the_task():
    result = t.complex_return_value.using(backend="single").enqueue()
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    assert result.errors[0].exception_class is UnstorableResult


CALLS: list[int] = []


@task(max_attempts=3, retry_backoff=0)
def side_effect_then_not_json() -> dt.datetime:
    CALLS.append(1)  # e.g. an e-mail sent
    return dt.datetime(2020, 1, 1)


def test_a_return_value_that_is_not_json_does_not_run_the_task_again():
    CALLS.clear()
    result = side_effect_then_not_json.enqueue()
    for _ in range(3):
        Job.objects.filter(pk=result.id).update(run_after=timezone.now())
        run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(CALLS) == 1
    assert [e.exception_class_path for e in result.errors] == ["jobstate.tasks.exceptions.UnstorableResult"]


def test_non_retryable_and_partial():
    failed = jt.non_retryable.enqueue()
    partial = jt.partial_result.enqueue()
    run_all()
    failed.refresh()
    partial.refresh()
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 1
    assert failed.errors[0].exception_class is NonRetryable
    assert partial.status == TaskResultStatus.SUCCESSFUL
    assert partial.return_value == {"rows": 2}
    assert partial.errors[-1].exception_class is Partial
    assert "2 of 3 rows" in partial.errors[-1].traceback
    assert Job.objects.get(pk=partial.id).status == "partial"


@pytest.mark.parametrize(
    ("job_status", "expected"),
    [
        ("queued", "READY"),
        ("processing", "RUNNING"),
        ("waiting", "RUNNING"),
        ("completed", "SUCCESSFUL"),
        ("partial", "SUCCESSFUL"),
        ("failed", "FAILED"),
        ("cancelled", "FAILED"),
    ],
)
def test_status_mapping(job_status, expected):
    assert status_of(job_status) == TaskResultStatus[expected]


def test_exception_paths():
    tb = "Traceback (most recent call last):\n  File 'x'\n    raise E\nmy.app.errors.Declined: no\n"
    assert exception_path("Declined", tb) == "my.app.errors.Declined"
    assert exception_path("ValueError", "Traceback\nValueError: x\n") == "builtins.ValueError"
    assert exception_path("Timeout", "") == "jobstate.tasks.exceptions.TaskTimeout"
    assert exception_path("WorkerLost") == "jobstate.tasks.exceptions.WorkerLost"
    assert exception_path("Inner", "a.b.Outer.Inner: m") == "a.b.Outer.Inner"


# -- priorities and defer ------------------------------------------------------------


def test_priority_order_is_preserved():
    now = timezone.now()
    old = t.noop_task.using(priority=20, run_after=now - timedelta(hours=2)).enqueue()
    very_old = t.noop_task.using(priority=20, run_after=now - timedelta(hours=10)).enqueue()
    t.noop_task.using(run_after=now + timedelta(hours=10)).enqueue()
    t.noop_task.using(priority=10, run_after=now + timedelta(hours=10)).enqueue()
    high = t.noop_task.using(priority=10).enqueue()
    low = t.noop_task.using(priority=2).enqueue()
    lower = t.noop_task.using(priority=-2).enqueue()
    lowest = t.noop_task.using(priority=-100).enqueue()
    highest = t.noop_task.using(priority=100).enqueue()
    default = t.noop_task.enqueue()
    order = [str(job.pk) for job in services.claim("w", limit=20)]
    assert order == [r.id for r in [highest, very_old, old, high, low, default, lower, lowest]]
    assert Job.objects.get(pk=highest.id).priority == 100


def test_run_after_defers():
    result = t.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
    assert run_all() == 0
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert default_task_backend.get_result(result.id).task.run_after == result.task.run_after
    Job.objects.filter(pk=result.id).update(run_after=timezone.now())
    assert run_all() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


# -- queues and backends -------------------------------------------------------------


def test_queue_name_is_a_kind_prefix():
    email = t.send_email.enqueue("a@example.com")
    routed = t.noop_task.using(queue_name="emails").enqueue()
    plain = t.noop_task.enqueue()
    assert Job.objects.get(pk=email.id).kind == "emails:tests.tasks_app.tasks.send_email"
    assert Job.objects.get(pk=routed.id).kind == "emails:tests.tasks_app.tasks.noop_task"
    assert default_task_backend.get_result(routed.id).task.queue_name == "emails"
    # A worker limited to the "emails" queue's kinds runs only those.
    emails_kinds = [k for k in registry.all_handlers() if k.startswith("emails:")]
    assert run_all(kinds=emails_kinds) == 2
    assert Job.objects.get(pk=plain.id).status == "queued"
    email.refresh()
    assert email.return_value == "sent to a@example.com"


def test_every_configured_queue_is_registered_for_workers():
    # A worker never runs .using(queue_name=...): it knows the kinds from the decoration.
    assert "emails:tests.tasks_app.tasks.noop_task" in registry.all_handlers()
    assert "tests.tasks_app.tasks.send_email" in registry.all_handlers()
    assert not any(k.startswith("unknown_queue:") for k in registry.all_handlers())


def test_multiple_backends():
    single = jt.single_queue.enqueue()
    assert single.backend == "single"
    assert single.task.queue_name == "anything"
    assert Job.objects.get(pk=single.id).max_attempts == 1
    assert task_backends["single"].options["MAX_ATTEMPTS"] == 1
    # Either jobstate backend reads any task job; the result names its own backend.
    assert default_task_backend.get_result(single.id).backend == "single"
    dummy = t.noop_task.using(backend="dummy").enqueue()
    assert not Job.objects.filter(pk__in=[single.id]).exclude(kind__contains="single_queue").exists()
    assert Job.objects.count() == 1
    assert task_backends["dummy"].get_result(dummy.id) == dummy
    run_all()
    single.refresh()
    assert single.return_value == "ok"


def test_worker_sends_started_and_finished(worker_signals):
    started, finished = worker_signals
    ok = t.calculate_meaning_of_life.enqueue()
    retried = jt.always_fails.enqueue()
    run_all()
    assert [(sender, r.id, r.status) for sender, r in started] == [
        (JobstateBackend, ok.id, TaskResultStatus.RUNNING),
        *[(JobstateBackend, retried.id, TaskResultStatus.RUNNING)] * 3,
    ]
    assert [r.attempts for _s, r in started] == [1, 1, 2, 3]
    # Sent once the final state is committed; not for attempts that are retried.
    assert [(sender, r.id, r.status) for sender, r in finished] == [
        (JobstateBackend, ok.id, TaskResultStatus.SUCCESSFUL),
        (JobstateBackend, retried.id, TaskResultStatus.FAILED),
    ]
    assert finished[0][1].return_value == 42 and len(finished[1][1].errors) == 3
    # What the worker sends is what get_result reads back.
    assert finished[0][1] == default_task_backend.get_result(ok.id)
    assert finished[1][1] == default_task_backend.get_result(retried.id)
    assert started[0][1].worker_ids == ["inline"] and started[0][1].started_at is not None


def test_task_started_on_a_retry_is_what_get_result_reads(worker_signals):
    started, _finished = worker_signals
    seen = []
    task_started.connect(
        lambda sender, task_result, **kwargs: seen.append(default_task_backend.get_result(task_result.id)),
        dispatch_uid="jobstate_tasks_read",
        weak=False,
    )
    try:
        result = jt.flaky.enqueue("m")
        for worker in ("w1", "w2"):
            with transaction.atomic():
                (job,) = services.claim(worker, limit=1)
            run_job(job, worker)
    finally:
        task_started.disconnect(dispatch_uid="jobstate_tasks_read")
    second = started[1][1]
    assert second == seen[1]
    assert second.status == TaskResultStatus.RUNNING
    assert (second.worker_ids, second.attempts) == (["w1", "w2"], 2)
    # As Django's TaskResult: the errors of the earlier attempts, none of this one.
    assert [e.exception_class for e in second.errors] == [RuntimeError]
    # The first claim stands in for the first attempt's start (docs/howto/django-tasks.md).
    assert second.started_at <= started[0][1].started_at < second.last_attempted_at
    assert second.last_attempted_at == Job.objects.get(pk=result.id).started_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("then_claimed", [False, True], ids=["requeued", "requeued-and-claimed"])
def test_task_started_shows_the_attempt_starting_when_it_is_ended_before_it_is_sent(
    worker_signals, then_claimed
):
    # An operator ends the attempt after the worker began it, before task_started is
    # sent: the result is the attempt as it began, not its row with a later history.
    started, _finished = worker_signals
    result = jt.flaky.enqueue("m")
    with transaction.atomic():
        (job,) = services.claim("w1", limit=1)
    run_job(job, "w1")
    begun = []

    def requeue(ctx):
        begun.append(default_task_backend.get_result(str(ctx.job.pk)))
        services.requeue(ctx.job.pk, actor="admin", reason="stuck")
        if then_claimed:
            services.claim("w3", limit=1, start=True)

    hooks.attempt_started.register(requeue)
    try:
        with transaction.atomic():
            (job,) = services.claim("w2", limit=1)
        assert run_job(job, "w2") == "lost"
    finally:
        hooks.attempt_started.unregister(requeue)
    second = started[1][1]
    assert second == begun[0]
    assert second.status == TaskResultStatus.RUNNING
    assert (second.worker_ids, second.attempts) == (["w1", "w2"], 2)
    assert [e.exception_class for e in second.errors] == [RuntimeError]
    result.refresh()
    assert [e.exception_class for e in result.errors] == [RuntimeError, OperatorRequeued]


def test_the_task_started_result_of_a_first_attempt_needs_no_query_and_of_a_retry_one(
    django_assert_num_queries,
):
    result = jt.flaky.enqueue("m")
    (job,) = services.claim("w1", limit=1, start=True)
    with django_assert_num_queries(0):  # the begun row says everything
        first = started_result(job, jt.flaky)
    assert first == default_task_backend.get_result(result.id)
    assert run_job(job, "w1") == "retrying"
    (job,) = services.claim("w2", limit=1, start=True)
    with django_assert_num_queries(1):  # the job and its history in one statement
        second = started_result(job, jt.flaky)
    assert second == default_task_backend.get_result(result.id)
    assert (second.status, second.worker_ids) == (TaskResultStatus.RUNNING, ["w1", "w2"])


@task()
def returns_int_keys() -> dict[int, str]:
    return {1: "one"}


def test_task_finished_return_value_is_the_stored_value(worker_signals):
    _started, finished = worker_signals
    result = returns_int_keys.enqueue()
    run_all()
    result.refresh()
    assert finished[0][1].return_value == result.return_value == {"1": "one"}


def test_a_task_finished_receiver_that_raises_leaves_the_attempts_outcome_alone(caplog):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver broke")

    task_finished.connect(broken, dispatch_uid="jobstate_tasks_broken", weak=False)
    try:
        ok = t.calculate_meaning_of_life.enqueue()
        failed = t.failing_task_value_error.using(backend="single").enqueue()
        outcomes = [run_job(services.claim("w1", limit=1)[0], "w1") for _ in (ok, failed)]
    finally:
        task_finished.disconnect(dispatch_uid="jobstate_tasks_broken")
    # The receiver's error is logged (by Django); the worker reports what it stored.
    assert outcomes == ["completed", "failed"]
    assert [r.status for r in (ok.task.get_result(ok.id), failed.task.get_result(failed.id))] == [
        TaskResultStatus.SUCCESSFUL,
        TaskResultStatus.FAILED,
    ]
    assert "receiver broke" in caplog.text and "could not be stored" not in caplog.text


CALLS: list[str] = []


@task(backend="single")  # one attempt
def records_its_call() -> None:
    CALLS.append("called")


def test_a_task_started_receiver_that_raises_fails_the_attempt_without_calling_the_task(worker_signals):
    # As django-tasks' database worker does: a worker has no caller to raise it to (Django's
    # ImmediateBackend runs the task in the caller, and raises it there).
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver broke")

    _started, finished = worker_signals
    CALLS.clear()
    task_started.connect(broken, dispatch_uid="jobstate_tasks_broken", weak=False)
    try:
        result = records_its_call.enqueue()
        assert run_job(services.claim("w1", limit=1)[0], "w1") == "failed"
    finally:
        task_started.disconnect(dispatch_uid="jobstate_tasks_broken")
    assert CALLS == []
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]
    assert "receiver broke" in result.errors[0].traceback
    assert [(r.id, r.status) for _s, r in finished] == [(result.id, TaskResultStatus.FAILED)]


# -- context, progress, assets, keys, owner ------------------------------------------


def test_takes_context():
    id_result = t.get_task_id.enqueue()
    ctx_result = t.test_context.enqueue(1)
    async_ctx = t.async_context.enqueue()
    run_all()
    for r in (id_result, ctx_result, async_ctx):
        r.refresh()
        assert r.status == TaskResultStatus.SUCCESSFUL, r.errors
    assert id_result.return_value == id_result.id
    assert ctx_result.return_value == {"attempt": 1, "id": ctx_result.id}
    assert async_ctx.return_value == 1


def test_context_attempt_counts_retries():
    result = jt.context_attempts.enqueue()
    run_all()
    result.refresh()
    assert result.return_value == 2 and result.attempts == 2


def test_context_reaches_jobstate_progress_and_assets(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    result = jt.with_progress.enqueue(4)
    job = Job.objects.get(pk=result.id)
    assert job.kind == "reports.progress"
    run_all()
    job.refresh_from_db()
    assert job.status == "completed" and job.result == 4
    assert job.progress == 100
    assert Asset.objects.get(job=job).name == "report.txt"


def test_an_async_task_reaches_jobstate_through_sync_to_async():
    # As docs/howto/django-tasks.md says: called directly, the context's methods raise
    # SynchronousOnlyOperation (they use the database); through sync_to_async they work.
    ok, direct = jt.async_progress.enqueue(False), jt.async_progress.enqueue(True)
    run_all()
    ok.refresh()
    direct.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == "done"
    job = Job.objects.get(pk=ok.id)
    assert job.progress == 100 and job.progress_message == "half way"
    assert direct.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in direct.errors] == [
        "django.core.exceptions.SynchronousOnlyOperation"
    ]


def test_current_outside_a_task():
    with pytest.raises(RuntimeError, match="only available while a task runs"):
        current()


def test_keys_make_enqueue_idempotent():
    first = jt.sync_account.enqueue(7)
    again = jt.sync_account.enqueue(7)
    other = jt.sync_account.enqueue(8)
    assert again.id == first.id and other.id != first.id
    assert Job.objects.get(pk=first.id).key == "account-7"
    one = jt.singleton.enqueue()
    assert jt.singleton.enqueue().id == one.id
    per_call = t.noop_task.using(key="call-1").enqueue()
    assert t.noop_task.using(key="call-1").enqueue().id == per_call.id


def test_key_callable_must_return_a_string():
    bad = jt.sync_account.using(key=lambda account: account)
    with pytest.raises(InvalidTask, match="returned 7"):
        bad.enqueue(7)
    # The service refused it as a ValidationError, naming no option of the task.
    with pytest.raises(InvalidTask, match="no NUL character"):
        jt.sync_account.using(key=lambda account: f"a\x00{account}").enqueue(7)
    # A blank key ("  ") was stored: every call whose key came out blank shared one job.
    with pytest.raises(InvalidTask, match="returned '  '"):
        jt.sync_account.using(key=lambda account: "  ").enqueue(7)
    with pytest.raises(InvalidTask, match="not only whitespace"):
        t.noop_task.using(key=" ").enqueue()
    assert not Job.objects.exists()


def test_owner(user):
    result = t.noop_task.using(owner=user).enqueue()
    job = Job.objects.get(pk=result.id)
    assert job.owner == user
    assert job.events.get().actor_label == "user:alice"


def test_an_owner_given_by_id_is_the_enqueue_actor(user):
    result = t.noop_task.using(owner=user.pk).enqueue()
    job = Job.objects.get(pk=result.id)
    assert job.owner == user
    assert job.events.get().actor_label == "user:alice"


def test_an_owner_that_is_no_user_is_a_validation_error_and_writes_nothing():
    # An AttributeError ('Group' object has no attribute 'get_username') before.
    with pytest.raises(ValidationError) as refused:
        t.noop_task.using(owner=Group.objects.create(name="ops")).enqueue()
    assert refused.value.message_dict == {"owner": ["Not a user: a Group."]}
    assert not Job.objects.exists()


# -- jobstate state changes seen through get_result -----------------------------------


def test_cancel_of_a_queued_task():
    result = t.noop_task.enqueue()
    services.request_cancel(result.id, reason="not needed")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is CancelRequested
    assert "not needed" in result.errors[-1].traceback


def test_cancel_of_a_running_task():
    result = jt.cancellable.enqueue(30)
    (job,) = services.claim("w", limit=1)
    result.refresh()
    assert result.status == TaskResultStatus.READY  # reserved by a cluster: not running yet
    job = services.begin(job, job.lease_token, "w").job
    services.request_cancel(job.pk, reason="stop it")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert run_job(job, "w") == "cancelled"
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is CancelRequested
    assert result.worker_ids == ["w"]


def test_rescue_by_the_reaper():
    result = t.noop_task.enqueue()
    (job,) = services.claim("lost-worker", limit=1, lease_seconds=1)
    job = services.begin(job, job.lease_token, "lost-worker", lease_seconds=1).job
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING and result.worker_ids == ["lost-worker"]
    report = services.requeue_expired(now=timezone.now() + timedelta(seconds=5))
    assert report.requeued == [job.pk]
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors[0].exception_class is WorkerLost
    assert "lost-worker" in result.errors[0].traceback
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())  # requeued "5 s from now"
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == ["lost-worker", "inline"]


def test_reaper_fails_the_last_attempt_of_a_lost_worker():
    result = t.noop_task.using(backend="single").enqueue()
    (job,) = services.claim("gone", limit=1, lease_seconds=1)
    job = services.begin(job, job.lease_token, "gone", lease_seconds=1).job
    report = services.requeue_expired(now=timezone.now() + timedelta(seconds=5))
    assert report.failed == [job.pk]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [WorkerLost]
    assert result.worker_ids == ["gone"] and result.finished_at is not None


def test_an_operator_retry_is_a_new_result():
    result = t.failing_task_value_error.using(backend="single").enqueue()
    run_all()
    again = services.retry(result.id, actor="admin")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    retried = default_task_backend.get_result(str(again.pk))
    assert retried.status == TaskResultStatus.READY and retried.id != result.id
    assert retried.args == result.args and retried.backend == "single"


def test_tasks_pickle_as_on_django():
    import pickle

    from jobstate.tasks.compat import BACKPORT

    if BACKPORT:  # the backport's Task cannot be pickled (its function's name is the Task): same here
        with pytest.raises(pickle.PicklingError):
            pickle.dumps(t.noop_task)
        return
    # Django 6.x pickles a Task by its module path, with every field (jobstate's included).
    assert pickle.loads(pickle.dumps(t.noop_task)) == t.noop_task
    assert pickle.loads(pickle.dumps(jt.flaky.using(priority=3))) == jt.flaky.using(priority=3)


def test_operator_requeue_and_fail():
    result = t.noop_task.enqueue()
    (job,) = services.claim("w", limit=1, start=True)  # begun: a reserved claim charges nothing
    services.requeue(job.pk, actor="admin", reason="stuck")
    services.force_fail(job.pk, actor="admin", reason="enough")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [OperatorRequeued, OperatorFailed]


@pytest.mark.parametrize("how", ["force_fail", "cancel_unstarted", "fail_with_cancel_requested"])
def test_a_reserved_claim_ended_by_its_job_ending_counts_no_attempt(how):
    # Only services.fail of a reserved job marked its history row: an operator's fail,
    # a worker's cancel before it began, and a failed begin whose cancel was requested
    # (ended cancelled instead) listed the claim's worker id while job.attempts was 0.
    result = jt.reports_attempt.enqueue()
    (job,) = services.claim("w1", limit=1)
    if how == "force_fail":
        services.force_fail(job.pk, actor="admin", reason="enough")
    else:
        services.request_cancel(job.pk, "ops", "no")
        if how == "cancel_unstarted":
            assert run_job(job, "w1") == "cancelled"
        else:
            services.fail_held(job, job.lease_token, "could not begin", error_type="OperationalError")
    result.refresh()
    assert Job.objects.get(pk=result.id).attempts == 0
    assert (result.status, result.worker_ids, result.attempts) == (TaskResultStatus.FAILED, [], 0)
    ended = JobEvent.objects.filter(job_id=result.id).latest("id")
    assert ended.metadata["unstarted"] is True
    # The job's ending stays its error, as services.fail's of a reserved job does.
    assert [e.exception_class for e in result.errors] == [
        OperatorFailed if how == "force_fail" else CancelRequested
    ]


def test_an_operator_requeue_of_a_reserved_job_counts_no_attempt_and_shows_no_error():
    # A reserved claim charged nothing: its requeue is no attempt's end (no
    # OperatorRequeued error, no worker id), whoever requeued it.
    result = jt.reports_attempt.enqueue()
    services.claim("w1", limit=1)
    services.requeue(result.id, actor="admin", reason="stuck")
    result.refresh()
    assert (result.status, result.worker_ids, result.errors) == (TaskResultStatus.READY, [], [])
    assert run_all() == 1
    result.refresh()
    assert Job.objects.get(pk=result.id).attempts == 1
    assert result.return_value == 1
    assert (result.attempts, result.worker_ids, result.errors) == (1, ["inline"], [])


def test_a_begun_attempt_ended_by_an_operator_keeps_its_worker_id():
    result = jt.reports_attempt.enqueue()
    (job,) = services.claim("w1", limit=1, start=True)
    services.force_fail(job.pk, actor="admin", reason="enough")
    result.refresh()
    assert (result.worker_ids, result.attempts) == (["w1"], 1)
    assert "unstarted" not in JobEvent.objects.filter(job_id=result.id).latest("id").metadata


def test_a_job_handed_back_unstarted_shows_no_error():
    result = t.noop_task.enqueue()
    (job,) = services.claim("w", limit=1, start=True)
    services.hand_back(job, job.lease_token, reason="its worker's hard time limit fired before it started")
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.errors == []


def test_a_job_handed_back_unstarted_counts_no_attempt_once_it_ran():
    result = t.noop_task.enqueue()
    (job,) = services.claim("w", limit=1, start=True)
    services.hand_back(job, job.lease_token, reason="hard time limit before it started")
    Job.objects.filter(pk=result.id).update(run_after=timezone.now())
    assert run_all() == 1
    result.refresh()
    assert Job.objects.get(pk=result.id).attempts == 1
    assert result.worker_ids == ["inline"] and result.attempts == 1 and result.errors == []


@pytest.mark.parametrize("where", ["begin", "setup"])
def test_a_job_whose_handler_could_not_be_started_counts_no_attempt_and_shows_no_error(monkeypatch, where):
    # The worker could not begin it, or set up its handler's call once begun (the
    # attempt refunded): requeued with that error, which no task raised. The result
    # counted that claim as an attempt, with a worker id and the error, once it ran.
    def broken(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    result = jt.reports_attempt.enqueue()
    with monkeypatch.context() as patched:
        if where == "begin":
            patched.setattr(services, "begin", broken)
        else:
            patched.setattr(runner, "Slot", broken)
        (job,) = services.claim("w1", limit=1)
        with pytest.raises(OperationalError):
            run_job(job, "w1")
    result.refresh()
    assert (result.status, result.attempts, result.errors) == (TaskResultStatus.READY, 0, [])
    Job.objects.filter(pk=result.id).update(run_after=timezone.now())
    assert run_all() == 1
    result.refresh()
    assert Job.objects.get(pk=result.id).attempts == 1
    assert result.return_value == 1  # context.attempt while it ran
    assert (result.attempts, result.worker_ids, result.errors) == (1, ["inline"], [])


def test_task_started_after_a_handler_that_could_not_be_started_is_the_attempt_as_it_began():
    # An operator requeues the attempt before task_started is sent: the history is cut
    # where that attempt began. The refunded attempt's claim was counted as an attempt,
    # so it was cut one attempt early (w3's claim counted as the third).
    result = jt.flaky.enqueue("m")
    with transaction.atomic():
        (job,) = services.claim("w1", limit=1)
    assert run_job(job, "w1") == "retrying"
    (job,) = services.claim("w2", limit=1, start=True)  # attempt 2; its call's set-up fails
    services.fail_held(job, job.lease_token, "boom", error_type="OSError", retry_delay=0, unstarted=True)
    (job,) = services.claim("w3", limit=1, start=True)  # attempt 2 again
    assert job.attempts == 2
    begun = default_task_backend.get_result(result.id)
    assert (begun.worker_ids, [e.exception_class for e in begun.errors]) == (["w1", "w3"], [RuntimeError])
    services.requeue(job.pk, actor="admin", reason="stuck")
    assert started_result(job, jt.flaky) == begun


@pytest.mark.parametrize("ends", ["complete", "fail"])
def test_a_claim_a_script_ends_without_begin_counts_only_if_it_stored_a_result(ends):
    # complete and mark_partial never mark a claim unstarted: the claim that stored the
    # result did the work, so the result shows that attempt and who made it. A script's
    # fail of a claim it never began spent none, as jobstate's own worker would have.
    result = jt.flaky.enqueue("m")
    (job,) = services.claim("script", limit=1)
    if ends == "complete":
        services.complete(job, job.lease_token, 7)
    else:
        services.fail(job, job.lease_token, "gave up", retry=False)
    result.refresh()
    assert Job.objects.get(pk=result.id).attempts == 0  # only begin charges it
    if ends == "complete":
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 7)
        assert (result.attempts, result.worker_ids) == (1, ["script"])
    else:
        assert (result.status, result.attempts, result.worker_ids) == (TaskResultStatus.FAILED, 0, [])


def test_a_reserved_job_requeued_by_the_reaper_counts_no_attempt_once_it_ran():
    result = jt.reports_attempt.enqueue()
    (job,) = services.claim("gone-cluster", limit=1, lease_seconds=1)
    assert services.requeue_expired(now=timezone.now() + timedelta(seconds=5)).requeued == [job.pk]
    Job.objects.filter(pk=result.id).update(run_after=timezone.now())
    assert run_all() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert Job.objects.get(pk=result.id).attempts == 1
    assert result.return_value == 1  # context.attempt while it ran
    assert result.attempts == 1
    assert result.worker_ids == ["inline"]
    assert result.errors == []


@pytest.mark.parametrize("wait_for_children", [False, True])
def test_a_run_that_gave_its_worker_back_counts_no_attempt(wait_for_children):
    # Suspend refunds the attempt (job.attempts, context.attempt): the result counted
    # the run that suspended as an attempt of its own, with a worker id, once it ended.
    result = jt.suspends_once.enqueue(wait_for_children)
    run_all()
    if not wait_for_children:
        result.refresh()
        assert result.status == TaskResultStatus.READY
        assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
        Job.objects.filter(pk=result.id).update(run_after=timezone.now())
        assert run_all() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert Job.objects.get(pk=result.id).attempts == 1
    assert result.return_value == 1  # context.attempt while it ran
    assert (result.attempts, result.worker_ids, result.errors) == (1, ["inline"], [])
    assert result.started_at == result.last_attempted_at == Job.objects.get(pk=result.id).started_at


def test_an_unstorable_return_value_fails_with_an_error_class_django_can_import():
    result = jt.returns_nan.enqueue()
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [UnstorableResult]


def test_timeout(settings):
    settings.JOBSTATE = {"HEARTBEAT_SECONDS": 0.1}
    result = jt.too_slow.enqueue()
    run_all()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TaskTimeout
    assert "Timed out after 0.5 s" in result.errors[0].traceback


# -- transactions ----------------------------------------------------------------------


def test_enqueue_is_part_of_the_surrounding_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        t.noop_task.enqueue()
        assert Job.objects.count() == 1
        raise RuntimeError("rolled back")
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


def test_on_commit_enqueue():
    with transaction.atomic():
        transaction.on_commit(lambda: t.noop_task.enqueue("on_commit"))
        enqueue_on_commit(t.echo, "helper", key="value")
        assert not Job.objects.exists()
    assert sorted(Job.objects.values_list("parameters", flat=True), key=str) == sorted(
        [{"args": ["on_commit"], "kwargs": {}}, {"args": ["helper"], "kwargs": {"key": "value"}}], key=str
    )
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit(t.noop_task)
        raise RuntimeError("rolled back")
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_on_commit_enqueue_checks_the_arguments_in_the_callers_transaction(django_user_model):
    # Checked only at the commit, a bad argument raised after the caller's rows were
    # committed, with no job for them.
    with pytest.raises(TypeError), transaction.atomic():  # as task.enqueue raises it
        django_user_model.objects.create(username="bob")
        enqueue_on_commit(t.noop_task, object())
    assert not django_user_model.objects.filter(username="bob").exists() and not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_commit_enqueue_checks_the_size_of_the_arguments_in_the_callers_transaction(django_user_model):
    # Checked by the service only at the commit: the ValidationError raised out of the
    # commit, after the caller's rows were committed, with no job for them.
    with pytest.raises(ValidationError, match="the limit is"), transaction.atomic():
        django_user_model.objects.create(username="bob")
        enqueue_on_commit(t.noop_task, "x" * 70_000)
    assert not django_user_model.objects.filter(username="bob").exists() and not Job.objects.exists()


def test_enqueue_on_commit_passes_using_and_task_arguments_to_the_task():
    with transaction.atomic():
        enqueue_on_commit(t.echo, using="fast", task="x")
    assert Job.objects.get().parameters == {"args": [], "kwargs": {"using": "fast", "task": "x"}}


def test_enqueue_on_commit_still_reads_using_as_the_database_of_a_task_without_that_argument():
    with pytest.warns(DeprecationWarning, match="using=alias"), transaction.atomic():
        enqueue_on_commit(t.calculate_meaning_of_life, using="default")
        assert not Job.objects.exists()
    assert Job.objects.get().parameters == {"args": [], "kwargs": {}}
