"""``JobstateBackend``: what a task may be called (kinds and queue names around the
``:`` of a job kind), the backend without jobstate installed, and the times a
``TaskResult`` reports (``started_at``, ``last_attempted_at``) as
docs/howto/django-tasks.md states them. The rest of the conformance suite is
tests/test_tasks_backend.py and tests/test_tasks_running.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from jobstate import registry, services
from jobstate.models import Job, JobEvent
from jobstate.tasks.compat import InvalidTask, TaskResultStatus, task
from jobstate.tasks.rebuild import rebuild_task
from jobstate.worker.runner import drain, run_job
from tests.tasks_app import jobstate_tasks as jt

try:
    from django.tasks import default_task_backend, task
except ImportError:
    from django_tasks import default_task_backend, task  # type: ignore[no-redef]


def plain_function() -> None:
    """A module-level function the tests decorate with a kind that is refused."""


# -- kinds and queue names -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["reports:daily", "emails:myapp.tasks.send", ":x", "x:"])
def test_a_kind_with_a_colon_is_refused(kind):
    with pytest.raises(InvalidTask) as info:
        task(kind=kind)(plain_function)
    assert str(info.value) == (
        f"kind must not contain ':' (got {kind!r}): a job kind's ':' separates the task's "
        f"queue name from its kind (\"emails:myapp.tasks.send\"); use another character, such as '.'."
    )
    assert not [k for k in registry.all_handlers() if kind in k or "plain_function" in k]


@pytest.mark.django_db(transaction=True)
def test_a_queue_name_with_a_colon_is_read_back_whole():
    routed = jt.single_queue.using(queue_name="eu:emails")
    kind = "eu:emails:tests.tasks_app.jobstate_tasks.single_queue"
    try:
        result = routed.enqueue()
        job = Job.objects.get(pk=result.id)
        assert job.kind == kind
        assert rebuild_task(jt.single_queue, job).queue_name == "eu:emails"
        read = default_task_backend.get_result(result.id)
        assert read.task.queue_name == "eu:emails"
        assert read == result
        assert drain("inline", kinds=[kind]) == 1
        result.refresh()
        assert result.return_value == "ok" and result.task.queue_name == "eu:emails"
    finally:
        registry.unregister(kind)


@pytest.mark.django_db(transaction=True)
def test_a_queue_name_with_a_nul_character_is_invalid():
    # QUEUES empty (any name): it reached the INSERT (DataError on PostgreSQL; stored on SQLite).
    with pytest.raises(InvalidTask, match="NUL"):
        jt.single_queue.using(queue_name="a\x00b").enqueue()
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_queue_name_that_is_not_a_string_is_invalid():
    # QUEUES empty (any name): Django's own @task(queue_name=None) made the job kind
    # "None:tests....", read back as the queue "None" (get_result differed from enqueue's).
    with pytest.raises(InvalidTask, match="queue_name must be a string"):
        task(queue_name=None, backend="single")(jt.flaky.func)
    with pytest.raises(InvalidTask, match="queue_name must be a string"):
        jt.single_queue.using(queue_name=5).enqueue()  # type: ignore[arg-type]
    assert not Job.objects.exists()
    assert not [kind for kind in registry.all_handlers() if kind.startswith(("None:", "5:"))]


@pytest.mark.django_db(transaction=True)
def test_a_run_after_that_cannot_be_stored_is_an_invalid_task():
    far = datetime(9999, 12, 31, 23, 30, tzinfo=dt_timezone(timedelta(hours=-5)))  # 10000 in UTC
    with pytest.raises(InvalidTask, match="run_after"):
        jt.single_queue.using(run_after=far).enqueue()
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_naive_run_after_is_an_invalid_task_that_says_what_to_do():
    # Django's own check said "run_after must be an aware datetime." (no remedy).
    naive = datetime(2030, 1, 1, 12, 0)
    with pytest.raises(InvalidTask) as info:
        jt.single_queue.using(run_after=naive).enqueue()
    assert str(info.value).startswith(
        "run_after must be a timezone-aware datetime (got the naive 2030-01-01T12:00:00): jobstate "
        "stores times in UTC. Use django.utils.timezone.now() + timedelta(...)"
    )
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_use_tz_false_run_after_is_refused_with_a_remedy_or_stored():
    naive, aware = datetime(2030, 1, 1, 12, 0), datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    with override_settings(USE_TZ=False):
        if connection.features.supports_timezones:  # PostgreSQL stores an aware run_after
            # A naive one was the service's ValidationError ("run_after is a timezone-aware
            # datetime."), naming no remedy.
            with pytest.raises(
                InvalidTask, match=r"\(with USE_TZ = False, where that is naive: datetime.now"
            ):
                jt.single_queue.using(run_after=naive).enqueue()
            assert not Job.objects.exists()
            result = jt.single_queue.using(run_after=aware).enqueue()
            assert Job.objects.get(pk=result.id).run_after == timezone.make_naive(aware)  # in TIME_ZONE
            return
        # SQLite: an aware one raised ValueError at the INSERT ("SQLite backend does not
        # support timezone-aware datetimes when USE_TZ is False"), a naive one the
        # service's ValidationError.
        for when in (naive, aware):
            with pytest.raises(InvalidTask) as info:
                jt.single_queue.using(run_after=when).enqueue()
            assert str(info.value) == (
                "run_after cannot be stored with USE_TZ = False: jobstate needs a timezone-aware "
                f"run_after, which Django stores in {connection.display_name} only with USE_TZ = True. "
                "Set USE_TZ = True (Django's default) to defer tasks, or enqueue without run_after."
            )
        assert not Job.objects.exists()
        jt.single_queue.enqueue()  # without run_after, as ever
    assert Job.objects.count() == 1


# -- the system check ----------------------------------------------------------------


NOT_INSTALLED = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    TASKS={"default": {"BACKEND": "jobstate.tasks.JobstateBackend"}},
)
django.setup()
from jobstate.tasks.compat import task_backends

try:
    task_backends["default"]
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_tasks_naming_jobstate_without_the_app_installed_says_what_to_install():
    # The first use failed with Django's RuntimeError about jobstate.models.asset.Asset's
    # app_label, and the E901 check meant to say it first could never run: with the app
    # not installed, none of jobstate's code ran before that import.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == (
        "ImproperlyConfigured jobstate.tasks.JobstateBackend needs 'jobstate' (and 'django_q') in "
        "INSTALLED_APPS: TASKS names jobstate's backend, but the app is not installed."
    ), done.stderr


def backend_messages(options: Any) -> list[checks.CheckMessage]:
    """What `manage.py check` (every registered check) says of a jobstate backend with these
    OPTIONS: on Django 6 through django.tasks' own check, on 5.2 (the backport, not an
    installed app) through jobstate's."""
    config = {"BACKEND": "jobstate.tasks.JobstateBackend", "OPTIONS": options}
    with override_settings(TASKS={"default": config}):
        return [m for m in manage_py_check() if str(m.id).startswith("jobstate.E9")]


def manage_py_check() -> list[checks.CheckMessage]:
    """What `manage.py check` runs of the tasks backends' checks: django.tasks' own check
    (registered on Django 6; by the backport only when "django_tasks" is installed) and
    jobstate's (the model checks are left out: they query the database on Django 6)."""
    found: list[checks.CheckMessage] = []
    for check in checks.registry.registry.get_checks():
        if check.__name__ == "check_tasks" or "jobstate" in getattr(check, "tags", ()):
            found += check(app_configs=None)
    return found


@pytest.mark.parametrize("attempts", [0, -1, 1001, "3", True, 2.5, 5.0, [3]])
def test_an_invalid_max_attempts_option_is_a_check_error(attempts):
    # It was found at the first enqueue of a task without its own max_attempts
    # (the service's ValidationError); `manage.py check` said nothing.
    (error,) = backend_messages({"MAX_ATTEMPTS": attempts})
    assert error.id == "jobstate.E902" and error.level == checks.ERROR and error.obj == "MAX_ATTEMPTS"
    assert error.msg.startswith(f"TASKS['default']['OPTIONS']['MAX_ATTEMPTS'] is {attempts!r}; it must be")
    assert "between 1 and 1000" in error.msg and "DEFAULT_MAX_ATTEMPTS" in error.hint


def test_unknown_options_are_a_check_error_and_valid_ones_pass():
    found = backend_messages({"MAX_ATTEMPTS": 2, "MODULES": [], "RETRIES": 3, "max_attempts": 4})
    assert [(m.id, m.obj) for m in found] == [("jobstate.E903", "RETRIES"), ("jobstate.E903", "max_attempts")]
    assert found[0].msg == "Unknown key 'RETRIES' in TASKS['default']['OPTIONS']."
    assert "MAX_ATTEMPTS, MODULES" in found[0].hint
    for options in (
        {},
        {"MAX_ATTEMPTS": 1},
        {"MAX_ATTEMPTS": 1000, "MODULES": ["tests.tasks_app.jobstate_tasks"]},
    ):
        assert backend_messages(options) == []
    (error,) = backend_messages(["MAX_ATTEMPTS", 3])
    assert (
        error.id == "jobstate.E903"
        and error.msg == "TASKS['default']['OPTIONS'] is a list; it must be a dict."
    )


# -- started_at and last_attempted_at ------------------------------------------------


def claim_at(worker: str, seconds_ago: float) -> Job:
    """A cluster reserves the next due job; its claim is dated ``seconds_ago``, so that
    the claim and the start of the attempt (``begin``, later) are told apart."""
    (job,) = services.claim(worker, limit=1)
    event = JobEvent.objects.filter(job_id=job.pk, transition="claim").order_by("-id")[0]
    JobEvent.objects.filter(pk=event.pk).update(created_at=timezone.now() - timedelta(seconds=seconds_ago))
    return job


def claim_times(result: Any) -> list[datetime]:
    events = JobEvent.objects.filter(job_id=result.id, transition="claim").order_by("id")
    return list(events.values_list("created_at", flat=True))


@pytest.mark.django_db(transaction=True)
def test_started_at_is_when_the_first_attempt_began():
    result = jt.flaky.enqueue("times")  # fails its first attempt, then succeeds

    job = claim_at("w1", 60)
    result.refresh()
    # Only reserved: not running, no attempt yet.
    assert result.status == TaskResultStatus.READY
    assert (result.started_at, result.last_attempted_at) == (None, None)
    assert result.worker_ids == [] and result.attempts == 0

    assert run_job(job, "w1") == "retrying"
    first_start = Job.objects.get(pk=result.id).started_at
    (first_claim,) = claim_times(result)
    assert first_start > first_claim + timedelta(seconds=30)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.started_at == first_start and result.last_attempted_at == first_start
    assert result.worker_ids == ["w1"] and len(result.errors) == 1

    job = claim_at("w2", 30)
    result.refresh()
    # The retry is only reserved; jobstate no longer holds the first attempt's start:
    # the first claim stands in, for the first and for the latest attempt.
    assert Job.objects.get(pk=result.id).started_at is None
    assert result.status == TaskResultStatus.READY
    assert result.started_at == first_claim and result.last_attempted_at == first_claim
    assert result.worker_ids == ["w1"] and result.attempts == 1
    assert [e.exception_class for e in result.errors] == [RuntimeError]

    assert run_job(job, "w2") == "completed"
    second_start = Job.objects.get(pk=result.id).started_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at == first_claim and result.last_attempted_at == second_start
    assert result.worker_ids == ["w1", "w2"]
    assert result.finished_at >= second_start


def test_a_missing_module_in_options_modules_names_the_setting(settings, tmp_path, monkeypatch):
    # It was a bare ModuleNotFoundError from AppConfig.ready(), naming no setting.
    from django.core.exceptions import ImproperlyConfigured

    import jobstate.tasks

    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"MODULES": ["myproject.jobs.tasks"]}},
    }
    with pytest.raises(
        ImproperlyConfigured,
        match=r"TASKS\['default'\]\['OPTIONS'\]\['MODULES'\] names "
        r"'myproject.jobs.tasks', which cannot be imported: no module named 'myproject'",
    ):
        jobstate.tasks.install()
    # A module that exists but imports a missing one keeps its own error.
    (tmp_path / "broken_tasks_module.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"MODULES": ["broken_tasks_module"]}},
    }
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        jobstate.tasks.install()


@pytest.mark.parametrize("modules", ["myapp.tasks", b"myapp.tasks", ["myapp.tasks", 3], {"myapp.tasks": 1}])
def test_modules_option_that_is_not_a_list_of_names_is_a_check_error_not_a_crash(settings, modules):
    # A string was iterated at startup: install() imported 'm', 'y', ... and raised
    # ImproperlyConfigured about module 'm' before any check could explain it.
    import jobstate.tasks

    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"MODULES": modules}},
    }
    jobstate.tasks.install()
    (error,) = backend_messages({"MODULES": modules})
    assert backend_messages({"MODULES": ("tests.tasks_app.jobstate_tasks",)}) == []
    assert backend_messages({"MODULES": None}) == []
    assert error.id == "jobstate.E904" and error.level == checks.ERROR and error.obj == "MODULES"
    assert error.msg == (
        f"TASKS['default']['OPTIONS']['MODULES'] is {modules!r}; it must be a list of module names "
        "(strings): no module in it was imported."
    )
    assert '"MODULES": ["myapp.tasks"]' in error.hint
