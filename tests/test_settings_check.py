"""JOBSTATE settings are validated by a system check (issue 10)."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.core import checks
from django.test import override_settings

from jobstate import conf, settings_checks


def errors() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["jobstate"]) if m.id.startswith("jobstate.E")]


def test_defaults_and_valid_values_pass():
    with override_settings(JOBSTATE={}):
        assert errors() == []
    with override_settings(
        JOBSTATE={"RETENTION_DAYS": None, "LEASE_SECONDS": 30.5, "RETRY_JITTER": 0, "PREFETCH": 20}
    ):
        assert errors() == []


def test_a_wrong_type_is_an_error_naming_the_expected_type():
    with override_settings(JOBSTATE={"RETENTION_DAYS": "thirty"}):
        (error,) = errors()
    assert error.id == "jobstate.E003" and error.level == checks.ERROR
    assert "'RETENTION_DAYS'" in error.msg and "expected int or float or None" in error.msg
    assert "LEASE_SECONDS (int or float)" in error.hint


def test_a_default_timeout_may_be_a_float_as_a_handlers_timeout():
    # It was an int only: 90.5 was E003, though @jobstate.handler(timeout=90.5) is fine.
    with override_settings(JOBSTATE={"DEFAULT_TIMEOUT": 90.5}):
        assert errors() == []
    with override_settings(JOBSTATE={"DEFAULT_TIMEOUT": "90"}):
        assert [e.obj for e in errors()] == ["DEFAULT_TIMEOUT"]


def test_booleans_are_not_numbers_and_counts_are_not_floats():
    with override_settings(JOBSTATE={"STUCK_LIST_LIMIT": True, "PRUNE_BATCH": 10.5, "PREFETCH": "x"}):
        assert sorted(e.obj for e in errors()) == ["PREFETCH", "PRUNE_BATCH", "STUCK_LIST_LIMIT"]


def test_an_unknown_key_is_an_error_listing_the_allowed_keys():
    with override_settings(JOBSTATE={"LEASE_SECOND": 60}):
        (error,) = errors()
    assert error.id == "jobstate.E002" and "'LEASE_SECOND'" in error.msg
    for key in conf.DEFAULTS:
        assert key in error.hint


def test_not_a_dict():
    with override_settings(JOBSTATE=[("LEASE_SECONDS", 60)]):
        (error,) = errors()
    assert error.id == "jobstate.E001"


def test_every_key_has_a_declared_type():
    """A key added with a None default must say which types it takes (conf.NULLABLE)."""
    for key in conf.DEFAULTS:
        assert object not in conf.allowed_types(key), key
        assert conf.accepts(conf.allowed_types(key), conf.DEFAULTS[key]), key


def test_a_key_of_an_earlier_version_warns_and_the_project_still_starts():
    with override_settings(JOBSTATE={"PREFETCH_SECONDS": 0.5}):
        assert errors() == []
        (warning,) = [m for m in checks.run_checks(tags=["jobstate"]) if m.id == "jobstate.W010"]
    assert warning.level == checks.WARNING and "'PREFETCH_SECONDS'" in warning.msg
    assert "WORKER_CHAIN_SECONDS" in warning.msg


def test_claim_batch_is_no_longer_read_and_says_so():
    # The pusher sizes its claims by idle worker processes (or PREFETCH): CLAIM_BATCH
    # was listed as a setting long after nothing read it.
    with override_settings(JOBSTATE={"CLAIM_BATCH": 50}):
        assert errors() == []
        (warning,) = [m for m in checks.run_checks(tags=["jobstate"]) if m.id == "jobstate.W010"]
    assert "'CLAIM_BATCH'" in warning.msg and "PREFETCH" in warning.msg


def test_values_are_kept_and_read_again_when_jobstate_changes():
    default = conf.DEFAULTS["LEASE_SECONDS"]
    assert conf.get("LEASE_SECONDS") == default
    with override_settings(JOBSTATE={"LEASE_SECONDS": 7}):
        assert conf.get("LEASE_SECONDS") == 7
        assert conf.get("HEARTBEAT_SECONDS") == conf.DEFAULTS["HEARTBEAT_SECONDS"]
        with override_settings(JOBSTATE={}):
            assert conf.get("LEASE_SECONDS") == default
        assert conf.get("LEASE_SECONDS") == 7
    assert conf.get("LEASE_SECONDS") == default


def test_a_storage_alias_missing_from_storages_is_an_error_not_a_crash_at_import():
    import pytest
    from django.core.exceptions import ImproperlyConfigured

    from jobstate.models.asset import UnknownStorage, _asset_storage

    with override_settings(JOBSTATE={"STORAGE": "assets"}):
        (error,) = errors()
        storage = _asset_storage()  # what the model's file field asks for as it is imported
    assert error.id == "jobstate.E004" and "'assets'" in error.msg and "default" in error.msg
    assert isinstance(storage, UnknownStorage)
    with pytest.raises(ImproperlyConfigured, match=r"'assets', which is not a key of settings\.STORAGES"):
        storage.exists("x")
    storages = {
        "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
        "assets": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    with override_settings(JOBSTATE={"STORAGE": "assets"}, STORAGES=storages):
        assert errors() == []


def test_a_file_system_storage_with_no_location_and_no_media_root_warns(tmp_path):
    # Each process (a worker, the web server) stored assets under its own current directory.
    def w011() -> list[str]:
        return [m.id for m in settings_checks.check_storage() if m.id == "jobstate.W011"]

    with override_settings(MEDIA_ROOT=""):
        assert w011() == ["jobstate.W011"]
        located = {
            "default": {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(tmp_path)},
            },
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
        with override_settings(STORAGES=located):
            assert w011() == []
        in_memory = {**located, "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
        with override_settings(STORAGES=in_memory):
            assert w011() == []
    with override_settings(MEDIA_ROOT=str(tmp_path)):
        assert w011() == []


@pytest.mark.parametrize(
    ("jobstate", "q_cluster"),
    [
        ({"LEASE_SECONDS": "sixty"}, {}),
        ({"HEARTBEAT_SECONDS": None}, {}),
        ({"CANCEL_GRACE_SECONDS": "thirty"}, {"broker_class": None, "timeout": 60, "retry": 90}),
    ],
)
def test_a_wrong_type_is_reported_by_checks_that_compute_with_it(jobstate, q_cluster, temp_handler):
    """The lease and hard-limit checks leave a wrong type to E003 (``manage.py check``
    crashed with a traceback in them instead)."""
    temp_handler("test.checked")
    q = {k: v for k, v in {**settings.Q_CLUSTER, **q_cluster}.items() if v is not None}
    with override_settings(JOBSTATE=jobstate, Q_CLUSTER=q):
        found = checks.run_checks(tags=["jobstate"])
    assert [m.obj for m in found if m.id == "jobstate.E003"] == list(jobstate)


def test_a_value_below_its_least_is_an_error():
    # PRUNE_BATCH 0: every prune looped for ever; ADMIN_COUNT_CAP 0: no stuck job counted.
    values = {"PRUNE_BATCH": 0, "ADMIN_COUNT_CAP": -1, "RETENTION_DAYS": float("nan")}
    with override_settings(JOBSTATE=values):
        found = errors()
    assert sorted((e.id, e.obj) for e in found) == [("jobstate.E005", key) for key in sorted(values)]
    with override_settings(JOBSTATE={"PRUNE_BATCH": 1, "ADMIN_COUNT_CAP": 1, "RETENTION_DAYS": 0}):
        assert errors() == []


def test_retention_of_infinite_days_is_an_error():
    # It passed the check ("inf >= 0"), and the daily prune raised (timedelta(days=inf));
    # None keeps every job.
    with override_settings(JOBSTATE={"RETENTION_DAYS": float("inf")}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E005", "RETENTION_DAYS") and "finite" in error.msg
    with override_settings(JOBSTATE={"RETENTION_DAYS": None}):
        assert errors() == []


@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), -float("inf")])
def test_a_webhook_timeout_must_be_a_finite_number_of_seconds_above_0(value):
    # Each delivery then failed at once (0 or less) or waited for ever (inf, NaN).
    with override_settings(JOBSTATE={"WEBHOOK_TIMEOUT": value}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E009", "WEBHOOK_TIMEOUT")
    assert "finite number of seconds, greater than 0" in error.msg and "Default: 5.0" in error.hint


def test_every_number_of_seconds_must_be_finite_and_most_above_0():
    seconds = sorted(key for key in conf.DEFAULTS if conf.is_seconds(key))
    assert {"LEASE_SECONDS", "HEARTBEAT_SECONDS", "DEFAULT_TIMEOUT", "WEBHOOK_TIMEOUT"} <= set(seconds)
    assert conf.SECONDS_FROM_ZERO.issubset(seconds)
    for bad in (float("inf"), float("nan"), -1):
        found = settings_checks.problems(dict.fromkeys(seconds, bad))
        assert sorted((e.id, e.obj) for e in found) == [("jobstate.E009", key) for key in seconds]
    zero = settings_checks.problems(dict.fromkeys(seconds, 0))
    assert sorted(e.obj for e in zero) == sorted(set(seconds) - conf.SECONDS_FROM_ZERO)
    assert all("greater than 0" in e.msg for e in zero)
    assert settings_checks.problems(dict.fromkeys(conf.SECONDS_FROM_ZERO, 0)) == []
    assert settings_checks.problems(dict.fromkeys(seconds, 0.5)) == []


BACKOFF = ["RETRY_BACKOFF_BASE", "RETRY_BACKOFF_MAX", "WEBHOOK_BACKOFF_BASE", "WEBHOOK_BACKOFF_MAX"]


@pytest.mark.parametrize("key", BACKOFF)
@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), float("inf"), -float("inf")])
def test_a_backoff_must_be_a_finite_number_of_seconds_from_0(key, value):
    # They passed: NaN made every retry immediate (the delay read as 0), a negative
    # base too, an infinite cap put a retry off by a year.
    with override_settings(JOBSTATE={key: value}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E009", key) and "0 or more" in error.msg


@pytest.mark.parametrize("key", BACKOFF)
@pytest.mark.parametrize("value", ["5", True, None])
def test_a_backoff_of_another_type_is_an_error(key, value):
    with override_settings(JOBSTATE={key: value}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E003", key)


@pytest.mark.parametrize("value", [-0.1, 1.5, 25, float("nan"), float("inf")])
def test_the_retry_jitter_must_be_a_fraction_from_0_to_1(value):
    # 25 (meant as 25 %) multiplied every delay by up to 26; NaN made every retry immediate.
    with override_settings(JOBSTATE={"RETRY_JITTER": value}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E010", "RETRY_JITTER") and "from 0 to 1" in error.msg
    for fine in (0, 0.5, 1, 1.0):
        with override_settings(JOBSTATE={"RETRY_JITTER": fine}):
            assert errors() == []
    with override_settings(JOBSTATE={"RETRY_JITTER": "0.25"}):
        assert [e.id for e in errors()] == ["jobstate.E003"]


@pytest.mark.parametrize(
    ("cap", "base"),
    [("RETRY_BACKOFF_MAX", "RETRY_BACKOFF_BASE"), ("WEBHOOK_BACKOFF_MAX", "WEBHOOK_BACKOFF_BASE")],
)
def test_a_backoff_cap_below_its_base_is_an_error(cap, base):
    # Every delay was the cap, whatever the attempt.
    with override_settings(JOBSTATE={base: 100, cap: 10}):
        (error,) = errors()
    assert (error.id, error.obj) == ("jobstate.E011", cap) and base in error.msg
    default_base = conf.DEFAULTS[base]
    with override_settings(JOBSTATE={cap: default_base / 2}):  # below the default base
        assert [(e.id, e.obj) for e in errors()] == [("jobstate.E011", cap)]
    with override_settings(JOBSTATE={base: 10 * conf.DEFAULTS[cap]}):  # above the default cap
        assert [(e.id, e.obj) for e in errors()] == [("jobstate.E011", cap)]
    for fine in ({base: 10, cap: 10}, {base: 0, cap: 0}, {base: 1, cap: 100}):
        with override_settings(JOBSTATE=fine):
            assert errors() == []
    with override_settings(JOBSTATE={base: float("nan"), cap: 10}):  # E009 alone: no comparison with NaN
        assert [(e.id, e.obj) for e in errors()] == [("jobstate.E009", base)]


LEAST = {
    "DEFAULT_MAX_ATTEMPTS": 1,
    "WEBHOOK_MAX_ATTEMPTS": 1,
    "WEBHOOK_DISABLE_AFTER": 1,
    "WORKFLOW_BATCH": 1,
    "MAX_PARAMETERS_BYTES": 1,
    "API_MAX_BODY_BYTES": 1,
    "METRICS_FOLD_BATCH": 1,
    "WEBHOOK_MAX_RESPONSE_BYTES": 0,
    "STUCK_LIST_LIMIT": 0,
    "PREFETCH": 0,
    "API_MAX_STREAMS_PER_USER": 0,
}


@pytest.mark.parametrize(("key", "least"), sorted(LEAST.items()))
def test_a_count_below_its_least_is_an_error(key, least):
    # DEFAULT_MAX_ATTEMPTS 0: an enqueue failed the database's constraint (a 500);
    # WORKFLOW_BATCH 0: every ctx.iterate raised; STUCK_LIST_LIMIT -1: the stuck page
    # was a 500; WEBHOOK_MAX_RESPONSE_BYTES -1 read whole responses.
    for bad in (least - 1, -1000):
        with override_settings(JOBSTATE={key: bad}):
            (error,) = errors()
        assert (error.id, error.obj) == ("jobstate.E005", key) and f"{least} or more" in error.msg
    with override_settings(JOBSTATE={key: least}):
        assert errors() == []


def test_the_connection_age_of_a_worker_is_a_finite_number_of_seconds_from_0():
    for bad in (-1, float("nan"), float("inf")):
        with override_settings(JOBSTATE={"WORKER_CONN_MAX_AGE": bad}):
            assert [(e.id, e.obj) for e in errors()] == [("jobstate.E009", "WORKER_CONN_MAX_AGE")]
    for fine in (None, 0, 30.5):
        with override_settings(JOBSTATE={"WORKER_CONN_MAX_AGE": fine}):
            assert errors() == []


@pytest.mark.parametrize("key", ["DEFAULT_TIMEOUT", "CANCEL_GRACE_SECONDS", "HARD_KILL_MARGIN_SECONDS"])
def test_an_infinite_number_of_seconds_is_reported_not_a_crash_of_the_checks(key, temp_handler):
    """W005 computes a hard limit from these: math.ceil(inf) raised in ``check``."""
    temp_handler("test.checked")
    q = {**settings.Q_CLUSTER, "broker_class": None, "timeout": 60, "retry": 90}
    with override_settings(JOBSTATE={key: float("inf")}, Q_CLUSTER=q):
        found = checks.run_checks(tags=["jobstate"])
    assert [m.obj for m in found if m.id == "jobstate.E009"] == [key]


def test_metrics_access_must_be_one_of_its_modes():
    # Any other value was taken as "token": every scrape without the token was refused.
    with override_settings(JOBSTATE={"METRICS_ACCESS": "Open"}):
        (error,) = errors()
    assert error.id == "jobstate.E006" and "'token', 'staff', 'open'" in error.msg
    for mode in ("token", "staff", "open"):
        # "token" needs its token (jobstate.E007, tests/test_metrics.py).
        with override_settings(JOBSTATE={"METRICS_ACCESS": mode, "METRICS_TOKEN": "s3cret"}):
            assert errors() == []


# This module is also a URLconf without the API, for the test below.
urlpatterns: list[Any] = []


def api_app_errors() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["jobstate"]) if m.id == "jobstate.E008"]


@pytest.mark.parametrize("app", ["rest_framework", "django_filters", "drf_spectacular"])
def test_the_api_mounted_without_an_app_its_pages_need_is_an_error(app, monkeypatch, settings):
    # The project started and the API's HTML pages were a 500 when served
    # (TemplateDoesNotExist: rest_framework/api.html, drf_spectacular/swagger_ui.html).
    settings.ROOT_URLCONF = "tests.host_urls"
    assert api_app_errors() == []
    installed = django_apps.is_installed
    monkeypatch.setattr(django_apps, "is_installed", lambda name: name != app and installed(name))
    (error,) = api_app_errors()
    assert error.level == checks.ERROR and f"{app!r} is not in INSTALLED_APPS" in error.msg
    settings.ROOT_URLCONF = __name__  # a project that does not mount the API needs none of them
    assert api_app_errors() == []


def test_the_api_priority_cap_is_a_priority_a_job_can_have():
    # An int, not a bool nor a float, within the priority column's range (a smallint).
    for bad, check in (
        (True, "jobstate.E003"),
        (1.0, "jobstate.E003"),
        ("5", "jobstate.E003"),
        (None, "jobstate.E003"),
        (-32769, "jobstate.E005"),
        (32768, "jobstate.E012"),
    ):
        with override_settings(JOBSTATE={"API_MAX_PRIORITY": bad}):
            assert [(e.id, e.obj) for e in errors()] == [(check, "API_MAX_PRIORITY")], bad
    for fine in (-32768, -5, 0, 10, 32767):
        with override_settings(JOBSTATE={"API_MAX_PRIORITY": fine}):
            assert errors() == [], fine
