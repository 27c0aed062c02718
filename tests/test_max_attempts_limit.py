"""One most number of runs (``conf.MAX_ATTEMPTS_LIMIT``) for every way a job gets its
``max_attempts``: enqueue's argument, a handler's or a task's option, the settings."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

import jobstate
from jobstate import conf, registry, services, settings_checks
from jobstate.exceptions import UnknownKind
from jobstate.models import Job
from jobstate.tasks import task
from jobstate.tasks.compat import InvalidTask

LIMIT = conf.MAX_ATTEMPTS_LIMIT
OUT_OF_RANGE = [0, -1, LIMIT + 1, 5000, True, 2.5, 3.0, float("nan"), float("inf"), "3"]


def test_the_limit_is_the_documented_1000() -> None:
    assert LIMIT == 1000


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_a_handler_outside_the_limit_is_refused_at_registration(temp_handler: Any, value: Any) -> None:
    # 5000 was registered, and every job of the kind got 5000 runs, which
    # enqueue(max_attempts=5000) itself refused.
    expected = r"Handler 'test\.many': max_attempts must be a whole number"
    with pytest.raises(ValueError, match=expected) as raised:
        temp_handler("test.many", max_attempts=value)
    assert f"between 1 and {LIMIT}, not {value!r}" in str(raised.value)
    with pytest.raises(UnknownKind):
        registry.get_handler("test.many")


def test_a_workflow_outside_the_limit_is_refused_at_registration() -> None:
    class Long(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx: Any) -> None:
            return None

    try:
        with pytest.raises(ValueError, match=rf"between 1 and {LIMIT}, not 5000"):
            jobstate.workflow("test.long_flow", max_attempts=5000)(Long)
        with pytest.raises(UnknownKind):
            registry.get_handler("test.long_flow")
    finally:
        registry.unregister("test.long_flow")


@pytest.mark.django_db
@pytest.mark.parametrize("value", [1, LIMIT])
def test_a_handler_at_the_bounds_makes_jobs_enqueue_accepts(temp_handler: Any, value: int) -> None:
    temp_handler("test.bounded", max_attempts=value)
    assert services.enqueue("test.bounded", {}).max_attempts == value
    assert services.enqueue("test.bounded", {}, max_attempts=value).max_attempts == value


@pytest.mark.django_db
def test_enqueue_refuses_one_above_the_limit(temp_handler: Any) -> None:
    temp_handler("test.bounded")
    with pytest.raises(ValidationError, match=f"between 1 and {LIMIT}"):
        services.enqueue("test.bounded", {}, max_attempts=LIMIT + 1)
    assert not Job.objects.exists()


def runs_often() -> None:
    pass


def test_a_task_option_above_the_limit_is_refused() -> None:
    with pytest.raises(InvalidTask, match=f"between 1 and {LIMIT} "):
        task(max_attempts=LIMIT + 1)(runs_often)


@pytest.mark.parametrize("key", ["DEFAULT_MAX_ATTEMPTS", "WEBHOOK_MAX_ATTEMPTS"])
def test_a_setting_above_the_limit_is_an_error(key: str) -> None:
    # Every job of a kind without its own max_attempts (every webhook delivery) got
    # more runs than enqueue takes; WEBHOOK_MAX_ATTEMPTS is passed to enqueue, which
    # refused every delivery.
    for bad in (LIMIT + 1, 10**6):
        (error,) = settings_checks.problems({key: bad})
        assert (error.id, error.obj) == ("jobstate.E012", key)
        assert f"{LIMIT} or less" in error.msg and "docs/reference/checks.md" in error.hint
    assert settings_checks.problems({key: LIMIT}) == []
    with override_settings(JOBSTATE={key: LIMIT + 1}):
        assert [m.id for m in settings_checks.check_settings()] == ["jobstate.E012"]
