"""System checks for a dangerous Q_CLUSTER (``manage.py check``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.core.checks import ERROR, run_checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from jobstate.worker.checks import check_sqlite_options, sqlite_options_errors, sqlite_warnings

GOOD: dict[str, Any] = dict(settings.Q_CLUSTER)
SQLITE_OK = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": "x.sqlite3",
    "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"},
}


def ids(**q_changes: Any) -> set[str]:
    q = {k: v for k, v in {**GOOD, **q_changes}.items() if v is not None}
    with override_settings(Q_CLUSTER=q):
        return {c.id for c in run_checks(tags=["jobstate"]) if c.id.startswith("jobstate.")}


@pytest.mark.django_db  # Django 6 checks models against the database too
def test_the_project_settings_pass():
    assert ids() == set()
    call_command("check", "--fail-level", "WARNING")


def test_w001_broker_is_not_the_job_table():
    assert "jobstate.W001" in ids(broker_class=None)
    assert "jobstate.W001" in ids(broker_class="django_q.brokers.orm.ORM")


def test_w013_django_q_is_not_installed(monkeypatch):
    # The check passed: migrate and enqueue worked, `qcluster` was an unknown command
    # and jobstate_schedule failed with "no such table: django_q_schedule".
    from django.apps import apps

    installed = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_q" and installed(name))
    (warning,) = [c for c in run_checks(tags=["jobstate"]) if c.id == "jobstate.W013"]
    assert "'django_q' is not in INSTALLED_APPS" in warning.msg


@pytest.mark.parametrize(("timeout", "retry"), [(660, 660), (700, 660), (None, 660)])
def test_w002_timeout_not_below_retry(timeout, retry):
    assert "jobstate.W002" in ids(timeout=timeout, retry=retry)


@pytest.mark.parametrize("attempts", [0, None])
def test_w003_unlimited_max_attempts(attempts):
    assert "jobstate.W003" in ids(max_attempts=attempts)


def test_w004_failures_not_acknowledged():
    assert "jobstate.W004" in ids(ack_failures=False)


def test_w005_cluster_timeout_shorter_than_a_handler_hard_limit(temp_handler):
    temp_handler("t.long", timeout=900)
    # With JobBroker each package carries its own limit: no warning.
    assert "jobstate.W005" not in ids(timeout=60, retry=120)
    # Id-only messages through the ORM broker are bound by the cluster timeout.
    assert "jobstate.W005" in ids(broker_class=None, timeout=60, retry=120)
    assert "jobstate.W005" not in ids(broker_class=None, timeout=3600, retry=3700)


def test_w006_results_only_in_the_cache():
    assert "jobstate.W006" in ids(cached=60)


def test_w007_sync_mode():
    assert "jobstate.W007" in ids(sync=True)


@override_settings(JOBSTATE={"LEASE_SECONDS": 20, "HEARTBEAT_SECONDS": 15})
def test_w008_heartbeat_too_slow_for_the_lease():
    assert "jobstate.W008" in ids()


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"},
        {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        {"transaction_mode": "IMMEDIATE", "timeout": 30},
    ],
)
def test_w009_sqlite_without_wal_immediate_and_busy_timeout(options):
    assert sqlite_warnings(SQLITE_OK) == []
    assert sqlite_warnings({"ENGINE": "django.db.backends.postgresql", "OPTIONS": {}}) == []
    (warning,) = sqlite_warnings({**SQLITE_OK, "OPTIONS": options})
    assert warning.id == "jobstate.W009"


def test_e013_sqlite_options_on_another_engine():
    # A project that moved from SQLite to PostgreSQL kept its OPTIONS: check passed,
    # then migrate failed with 'invalid connection option "init_command"'.
    postgres = {"ENGINE": "django.db.backends.postgresql", "OPTIONS": SQLITE_OK["OPTIONS"]}
    (error,) = sqlite_options_errors("default", postgres, "postgresql")
    assert error.id == "jobstate.E013" and error.level == ERROR
    assert "'init_command', 'transaction_mode', 'timeout'" in error.msg
    assert "DATABASES['default']" in error.msg and "django.db.backends.sqlite3" in error.hint
    (error,) = sqlite_options_errors("other", {**postgres, "ENGINE": "x.mysql"}, "mysql")
    assert "'init_command'" not in error.msg  # MySQL's driver takes one
    assert sqlite_options_errors("default", SQLITE_OK, "sqlite") == []
    assert (
        sqlite_options_errors("default", {**postgres, "OPTIONS": {"sslmode": "require"}}, "postgresql") == []
    )
    assert sqlite_options_errors("default", {"ENGINE": "django.db.backends.postgresql"}, "postgresql") == []


def test_e013_reads_every_database_by_its_backend():
    assert "jobstate.E013" not in ids()  # the project's settings, SQLite or PostgreSQL
    databases = {"default": {**settings.DATABASES["default"], "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}
    with mock.patch("jobstate.worker.checks.settings", SimpleNamespace(DATABASES=databases)):
        found = [error.id for error in check_sqlite_options()]
    assert found == ([] if connection.vendor == "sqlite" else ["jobstate.E013"])


def test_w014_prune_budget_not_well_below_the_cluster_timeout(settings):
    # The scheduled prune is a plain django-q2 task: the cluster timeout kills it mid-run.
    assert "jobstate.W014" not in ids()  # the default budget, 240 s, with the project's timeout 600
    assert "jobstate.W014" in ids(timeout=300, retry=360)
    settings.JOBSTATE = {"PRUNE_MAX_SECONDS": 120}
    assert "jobstate.W014" not in ids(timeout=300, retry=360)
    settings.JOBSTATE = {"PRUNE_MAX_SECONDS": 120, "RETENTION_DAYS": None}  # no scheduled prune
    assert "jobstate.W014" not in ids(timeout=60, retry=120)
    settings.JOBSTATE = {"PRUNE_MAX_SECONDS": "fast"}  # E003's
    assert "jobstate.W014" not in ids(timeout=60, retry=120)


@pytest.mark.parametrize("catch_up", [True, None])  # None: left out, django-q2's default (True)
def test_w015_missed_schedule_runs_are_caught_up_one_per_tick(catch_up):
    assert "jobstate.W015" in ids(catch_up=catch_up)
    assert "jobstate.W015" not in ids(catch_up=False)


def test_w015_not_without_django_q(monkeypatch):
    from django.apps import apps

    installed = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_q" and installed(name))
    assert "jobstate.W015" not in ids(catch_up=True)


def test_w016_a_cluster_name_of_its_own_runs_no_schedule_without_a_cluster():
    # django-q2's scheduler takes the schedules with no cluster (jobstate_schedule's)
    # only in a cluster whose cluster_name is its name: the reaper and prune never ran.
    assert "jobstate.W016" in ids(cluster_name="other")
    assert "jobstate.W016" in ids(name=None, cluster_name="other")  # name: "default"
    assert "jobstate.W016" not in ids(cluster_name=GOOD["name"])
    assert "jobstate.W016" not in ids(name=None, cluster_name="default")
    assert "jobstate.W016" not in ids(cluster_name=None)


@pytest.mark.django_db
@pytest.mark.parametrize(("cluster_name", "runs"), [("jobstate", True), ("other", False)])
def test_w016_django_q2_runs_schedules_with_no_cluster_only_where_cluster_name_is_name(
    monkeypatch, cluster_name, runs
):
    # W016's premise, on the installed django-q2.
    from datetime import timedelta
    from unittest import mock

    from django.utils import timezone
    from django_q import scheduler
    from django_q.conf import Conf
    from django_q.models import Schedule

    from jobstate.worker import schedules

    monkeypatch.setattr(Conf, "PREFIX", "jobstate")
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name)
    schedules.install(prune=False)
    Schedule.objects.update(next_run=timezone.now() - timedelta(minutes=5))
    monkeypatch.setattr(scheduler, "close_old_django_connections", lambda: None)  # the test's transaction
    with mock.patch.object(scheduler, "async_task", return_value="task-id") as sent:
        scheduler.scheduler(broker=mock.Mock())
    assert sent.called is runs
