"""The jobstate commands before ``migrate``, or before the migrations of an upgrade: one line
saying to run it (and which migrations it applies), not a traceback (``OperationalError: no
such table: django_q_schedule``, ``no such column: jobstate_asset.attempt``); other database
errors as they were."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from jobstate.worker import schedules
from tests.test_claim_concurrency import ROOT, database_env
from tests.test_migrations import migrate

pytestmark = pytest.mark.django_db

JOB = "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43"
# Every command that reads or writes the database (not kinds, not diagram).
COMMANDS = [
    "jobstate enqueue test.echo",
    f"jobstate show {JOB}",
    f"jobstate cancel {JOB}",
    f"jobstate retry {JOB}",
    "jobstate_workflow start wf.saga",
    f"jobstate_workflow state {JOB}",
    f"jobstate_workflow retry {JOB}",
    f"jobstate_workflow skip {JOB} book",
    f"jobstate_workflow stop {JOB}",
    "jobstate_schedule",
    "jobstate_schedule --remove",
    "jobstate_stuck",
    "jobstate_stuck --counts",
    "jobstate_prune",
    "jobstate_prune --dry-run",
    "jobstate_reap",
    "jobstate_move_hot_columns",  # PostgreSQL only: elsewhere it has nothing to do
    "jobstate_move_hot_columns --check",
]

# Each command, run in a process whose database has no table; what each said, as JSON.
SCRIPT = """
import io, json, sys
import django
django.setup()
from django.core.management import call_command
said = {}
for line in sys.argv[1:]:
    try:
        call_command(*line.split(), stdout=io.StringIO(), stderr=io.StringIO())
        said[line] = "ran"
    except Exception as exc:
        said[line] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(said))
"""

MIGRATE_FIRST = re.compile(r"CommandError: The database has no (\w+) table: run `manage\.py migrate` first")


def unmigrated_env(tmp_path: Path) -> dict[str, str]:
    env = database_env()
    if connection.vendor == "postgresql":  # the test database, where a schema that is not there hides it
        env["DATABASE_URL"] += "?options=-c%20search_path%3Djobstate_unmigrated"
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'unmigrated.sqlite3'}"
    return env


def test_every_command_says_to_migrate_first_on_a_database_without_tables(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *COMMANDS],
        cwd=ROOT,
        env=unmigrated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    if connection.vendor != "postgresql":
        assert said.pop("jobstate_move_hot_columns") == said.pop("jobstate_move_hot_columns --check") == "ran"
    wrong = {line: what for line, what in said.items() if not MIGRATE_FIRST.fullmatch(what)}
    assert wrong == {}
    # It was a traceback: OperationalError: no such table: django_q_schedule.
    assert said["jobstate_schedule"] == (
        "CommandError: The database has no django_q_schedule table: run `manage.py migrate` first"
    )


# Before the asset's attempt columns and the webhook tables.
BEFORE_ASSET_ATTEMPTS = ("jobstate", "0009_worker_processes")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_database_migrated_in_part_names_the_migrations_not_applied() -> None:
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    (last,) = [name for app, name in latest if app == "jobstate"]
    later = [
        n for app, n in executor.loader.disk_migrations if app == "jobstate" and n > BEFORE_ASSET_ATTEMPTS[1]
    ]
    old = migrate([BEFORE_ASSET_ATTEMPTS])
    try:
        Job = old.get_model("jobstate", "Job")
        job = Job.objects.create(kind="test.echo", status="queued")
        # The upgrade's code on the release before's tables: a column, then a table it lacks.
        with pytest.raises(CommandError) as show:
            call_command("jobstate", "show", str(job.pk), stdout=io.StringIO())
        with pytest.raises(CommandError) as cancel:
            call_command("jobstate", "cancel", str(job.pk), stdout=io.StringIO())
        # In a caller's transaction: on PostgreSQL the error aborted it, so the check's own
        # queries failed and the ProgrammingError came out without the advice.
        with pytest.raises(CommandError) as inside, transaction.atomic():
            call_command("jobstate", "show", str(job.pk), stdout=io.StringIO())
        status = Job.objects.get(pk=job.pk).status
    finally:
        migrate(latest)
    advice = (
        "run `manage.py migrate` first; not applied: jobstate 0010_waiting_status_step_fsm_asset_attempt "
        f"to {last} ({len(later)} migrations)"
    )
    # It was a traceback: OperationalError: no such column: jobstate_asset.attempt.
    assert str(show.value) == f"The database's jobstate_asset table has no attempt column: {advice}"
    assert str(cancel.value) == f"The database has no jobstate_webhookendpoint table: {advice}"
    assert str(inside.value) == str(show.value)
    assert status == "queued"  # the cancel wrote nothing


@pytest.mark.parametrize(
    "error",
    [
        "database is locked",
        # Names a table, which is there: not "run migrate".
        "database table is locked: django_q_schedule",
        # Names a column, which is there.
        "no such column: django_q_schedule.name",
    ],
)
def test_other_database_errors_are_as_they_were(monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    def install(**kwargs: object) -> None:
        raise OperationalError(error)

    monkeypatch.setattr(schedules, "install", install)
    with pytest.raises(OperationalError, match=re.escape(error)):
        call_command("jobstate_schedule", stdout=io.StringIO())
