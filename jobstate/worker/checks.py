"""System checks (``manage.py check``) for a Q_CLUSTER that could run a job twice,
hide a failure, or never run jobs at all. jobstate owns retries, timeouts and
rescue; django-q2 must deliver each package once and report every failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import connections

from jobstate import conf, registry
from jobstate.worker.limits import hard_limit_for

BROKER = "jobstate.worker.broker.JobBroker"
DOCS = conf.CHECKS_DOCS


def _q() -> dict[str, Any]:
    return dict(getattr(settings, "Q_CLUSTER", None) or {})


@register("jobstate")
def check_q_cluster(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    q = _q()
    handlers = registry.all_handlers()
    found: list[Warning] = []
    if handlers and q.get("broker_class") != BROKER:
        found.append(
            Warning(
                f"Q_CLUSTER['broker_class'] is {q.get('broker_class')!r}: "
                "qcluster will not run jobstate jobs.",
                hint=f"Set Q_CLUSTER['broker_class'] = '{BROKER}'. {DOCS}",
                id="jobstate.W001",
            )
        )
    timeout, retry = q.get("timeout"), q.get("retry", 60)
    if not timeout or timeout >= retry:
        found.append(
            Warning(
                f"Q_CLUSTER timeout ({timeout}) is not below retry ({retry}): django-q2 hands a task "
                "that is still running to a second worker.",
                hint=f"Set timeout below retry, e.g. timeout=600, retry=660. {DOCS}",
                id="jobstate.W002",
            )
        )
    if not q.get("max_attempts"):
        found.append(
            Warning(
                "Q_CLUSTER['max_attempts'] is unlimited: django-q2 re-runs failed tasks forever, "
                "beside jobstate's own retries.",
                hint=f"Set Q_CLUSTER['max_attempts'] = 1; jobstate retries jobs per handler. {DOCS}",
                id="jobstate.W003",
            )
        )
    if not q.get("ack_failures"):
        found.append(
            Warning(
                "Q_CLUSTER['ack_failures'] is off: a failed task stays queued and runs again after retry.",
                hint=f"Set Q_CLUSTER['ack_failures'] = True. {DOCS}",
                id="jobstate.W004",
            )
        )
    hard_limit = ("DEFAULT_TIMEOUT", "CANCEL_GRACE_SECONDS", "HARD_KILL_MARGIN_SECONDS")
    if q.get("broker_class") != BROKER and timeout and conf.well_typed(*hard_limit):
        # Only the id-only path (plain messages) is bound by the cluster timeout:
        # JobBroker packages carry each handler's own hard limit.
        short = [s.name for s in handlers.values() if hard_limit_for(s) > timeout]
        if short:
            found.append(
                Warning(
                    f"Q_CLUSTER timeout ({timeout} s) is shorter than the hard limit of handler(s) "
                    f"{', '.join(sorted(short)[:5])}: django-q2 would kill them mid-job.",
                    hint="Raise timeout (and retry) above the longest handler timeout + cancel grace. "
                    + DOCS,
                    id="jobstate.W005",
                )
            )
    if q.get("cached"):
        found.append(
            Warning(
                "Q_CLUSTER['cached'] sends task results, failures included, to the cache only.",
                hint=f"Remove 'cached' so failed tasks are saved and shown in the admin. {DOCS}",
                id="jobstate.W006",
            )
        )
    if q.get("sync"):
        found.append(
            Warning(
                "Q_CLUSTER['sync'] runs tasks inside the caller, with no worker, lease or timeout.",
                hint=f"Use sync only in debugging sessions. {DOCS}",
                id="jobstate.W007",
            )
        )
    return found


@register("jobstate")
def check_django_q(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """django-q2 runs the jobs: without its app the project started, migrated and
    enqueued, and no job ever ran."""
    if apps.is_installed("django_q"):
        return []
    return [
        Warning(
            "'django_q' is not in INSTALLED_APPS: there is no qcluster command, so jobs stay queued, "
            "and jobstate_schedule fails (no django_q_schedule table).",
            hint=f"Add 'django_q' to INSTALLED_APPS, then run migrate. {DOCS}",
            id="jobstate.W013",
        )
    ]


@register("jobstate")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """How django-q2 runs jobstate's schedules (``jobstate_schedule``): the reaper
    every minute, the prune daily."""
    if not apps.is_installed("django_q"):
        return []  # W013's
    q = _q()
    found: list[Warning] = []
    if q.get("catch_up", True):  # django-q2's default
        found.append(
            Warning(
                "Q_CLUSTER['catch_up'] is not False: after a downtime django-q2 runs every missed run "
                "of a schedule, one per scheduler tick (about 30 s): a day down queues 1,440 runs of the "
                "every-minute reaper, 12 hours of them, and one prune per missed day.",
                hint=f"Set Q_CLUSTER['catch_up'] = False: the next run then takes what was missed. {DOCS}",
                id="jobstate.W015",
            )
        )
    name, cluster_name = q.get("name", "default"), q.get("cluster_name")
    if cluster_name and cluster_name != name:
        # django-q2's scheduler takes a schedule with no cluster (jobstate's) only in a
        # cluster whose cluster_name is its name (django_q.scheduler).
        found.append(
            Warning(
                f"Q_CLUSTER['cluster_name'] ({cluster_name!r}) differs from Q_CLUSTER['name'] ({name!r}): "
                "django-q2 runs a schedule with no cluster, as jobstate_schedule installs the reaper's "
                "and the prune's by default, only in a cluster whose cluster_name is its name, so they "
                "never run in this one.",
                hint=f"Pin them to this cluster with manage.py jobstate_schedule --cluster {cluster_name} "
                "(then silence jobstate.W016 in SILENCED_SYSTEM_CHECKS), or remove "
                f"Q_CLUSTER['cluster_name'], or set it to Q_CLUSTER['name']. {DOCS}",
                id="jobstate.W016",
            )
        )
    return found


@register("jobstate")
def check_prune_budget(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """The scheduled prune is a plain django-q2 task: past Q_CLUSTER's timeout it is
    killed mid-run (and its batch can overrun its budget a little)."""
    timeout = _q().get("timeout")
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not timeout > 0  # W002's
        or not conf.well_typed("PRUNE_MAX_SECONDS", "RETENTION_DAYS")
        or conf.get("RETENTION_DAYS") is None  # no scheduled prune
    ):
        return []
    budget = float(conf.get("PRUNE_MAX_SECONDS"))
    if budget <= timeout / 2:
        return []
    return [
        Warning(
            f"JOBSTATE PRUNE_MAX_SECONDS ({budget:g}) is more than half of Q_CLUSTER['timeout'] "
            f"({timeout:g}): django-q2 kills the scheduled prune mid-run once it runs past the timeout.",
            hint=f"Keep PRUNE_MAX_SECONDS at most half of Q_CLUSTER['timeout']. {DOCS}",
            id="jobstate.W014",
        )
    ]


@register("jobstate")
def check_leases(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if not conf.well_typed("LEASE_SECONDS", "HEARTBEAT_SECONDS"):
        return []  # E003 says what is wrong
    lease, beat = float(conf.get("LEASE_SECONDS")), float(conf.get("HEARTBEAT_SECONDS"))
    if beat * 2 > lease:
        return [
            Warning(
                f"JOBSTATE HEARTBEAT_SECONDS ({beat:g}) is more than half of LEASE_SECONDS ({lease:g}): "
                "one late heartbeat lets the reaper rescue a job that is still running.",
                hint=f"Keep HEARTBEAT_SECONDS at most half of LEASE_SECONDS. {DOCS}",
                id="jobstate.W008",
            )
        ]
    return []


@register("jobstate")
def check_interrupt_grace(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    names = (
        "INTERRUPT_GRACE_SECONDS",
        "HEARTBEAT_SECONDS",
        "CANCEL_GRACE_SECONDS",
        "HARD_KILL_MARGIN_SECONDS",
    )
    if not conf.well_typed(*names):
        return []  # E003 says what is wrong
    grace, beat, cancel, margin = (float(conf.get(name)) for name in names)
    # Giving a handler up takes its grace, then up to a heartbeat interval to record
    # the outcome; django-q2's hard limit comes CANCEL_GRACE + HARD_KILL_MARGIN past
    # the timeout, and its kill leaves the job to the reaper (WorkerLost).
    if grace + beat >= cancel + margin:
        return [
            Warning(
                f"JOBSTATE INTERRUPT_GRACE_SECONDS ({grace:g}) + HEARTBEAT_SECONDS ({beat:g}) is not below "
                f"CANCEL_GRACE_SECONDS + HARD_KILL_MARGIN_SECONDS ({cancel + margin:g}): django-q2's hard "
                "time limit kills a handler deaf to its timeout before jobstate gives it up, and the "
                "reaper records WorkerLost instead of the Timeout.",
                hint=f"Lower INTERRUPT_GRACE_SECONDS, or raise HARD_KILL_MARGIN_SECONDS. {DOCS}",
                id="jobstate.W017",
            )
        ]
    return []


@register("jobstate")
def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    return sqlite_warnings(settings.DATABASES.get("default", {}))


# The OPTIONS W009 asks of SQLite, which only Django's SQLite backend reads: another
# backend hands them to its driver, which refuses to connect (psycopg: 'invalid
# connection option "init_command"'), so migrate is the first to fail.
SQLITE_OPTIONS = ("init_command", "transaction_mode", "timeout")
DRIVER_TAKES = {"mysql": {"init_command"}}


@register("jobstate")
def check_sqlite_options(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    return [
        error
        for alias, db in settings.DATABASES.items()
        for error in sqlite_options_errors(alias, db, connections[alias].vendor)
    ]


def sqlite_options_errors(alias: str, db: Mapping[str, Any], vendor: str) -> list[Error]:
    options = db.get("OPTIONS") or {}
    taken = DRIVER_TAKES.get(vendor, set())
    wrong = [key for key in SQLITE_OPTIONS if key in options and key not in taken]
    if vendor == "sqlite" or not wrong:
        return []
    return [
        Error(
            f"DATABASES[{alias!r}]['OPTIONS'] has SQLite's {', '.join(map(repr, wrong))} but its ENGINE "
            f"is {db.get('ENGINE')!r}: connections will fail ({vendor} does not take them).",
            hint=f"Set these OPTIONS only when the ENGINE is django.db.backends.sqlite3. {DOCS}",
            id="jobstate.E013",
        )
    ]


def sqlite_warnings(db: Mapping[str, Any]) -> list[Warning]:
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return []
    options = db.get("OPTIONS", {})
    problems = []
    if options.get("transaction_mode") != "IMMEDIATE":
        problems.append("transaction_mode is not IMMEDIATE")
    if float(options.get("timeout", 5)) < 10:
        problems.append("the busy timeout is under 10 s")
    if "journal_mode=wal" not in str(options.get("init_command", "")).replace(" ", "").lower():
        problems.append("WAL is not enabled")
    if not problems:
        return []
    return [
        Warning(
            f"SQLite shared by the web server and workers: {'; '.join(problems)}; expect "
            "'database is locked' errors.",
            hint="OPTIONS = {'transaction_mode': 'IMMEDIATE', 'timeout': 30, "
            f"'init_command': 'PRAGMA journal_mode=WAL;'}}. {DOCS}",
            id="jobstate.W009",
        )
    ]
