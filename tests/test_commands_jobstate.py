"""``manage.py jobstate`` (enqueue, cancel, retry, kinds, show) and the
``jobstate_workflow`` errors: every change through the services, every error one line."""

from __future__ import annotations

import argparse
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command, get_commands, load_command_class
from django.test import override_settings
from django.utils import timezone
from django.utils.html import strip_tags

from jobstate import services
from jobstate.admin.inlines import EventColumns
from jobstate.models import Asset, Job, JobEvent, JobStep
from jobstate.services import control, retries
from jobstate.states import Status
from tests.admin_support import completed, failed, processing, queued

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    message = str(info.value)
    assert "\n" not in message and "[" not in message and "Traceback" not in message, message
    return message


def test_enqueue_with_every_option(user: Any) -> None:
    later = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    out, _ = run(
        "jobstate",
        "enqueue",
        "test.echo",
        "--params",
        '{"n": 5}',
        "--owner",
        user.username,
        "--key",
        "k-1",
        "--priority",
        "7",
        "--run-after",
        later.isoformat(),
    )
    job = Job.objects.get(pk=out.strip())
    assert (job.kind, job.parameters, job.owner, job.key, job.priority) == (
        "test.echo",
        {"n": 5},
        user,
        "k-1",
        7,
    )
    assert job.run_after == later and job.status == Status.QUEUED
    event = JobEvent.objects.get(job=job)
    assert event.actor_label.startswith("cli:") and event.reason == "enqueued from the command line"
    again, err = run("jobstate", "enqueue", "test.echo", "--owner", user.username, "--key", "k-1")
    assert again.strip() == str(job.pk) and Job.objects.count() == 1
    assert err.strip() == "A job with key 'k-1' exists (queued); nothing queued."


def test_enqueue_with_the_key_of_a_completed_job_does_not_call_it_active() -> None:
    # It said "An active job with key 'done' exists (completed)".
    done = completed(key="done")
    out, err = run("jobstate", "enqueue", "test.echo", "--key", "done")
    assert out.strip() == str(done.pk) and Job.objects.count() == 1
    assert err.strip() == "A job with key 'done' exists (completed); nothing queued."


def test_enqueue_errors_are_one_line(user: Any) -> None:
    assert "Unknown job kind 'nope'" in refused("jobstate", "enqueue", "nope")
    assert "--params is not JSON" in refused("jobstate", "enqueue", "test.echo", "--params", "{n: 1}")
    assert "JSON object" in refused("jobstate", "enqueue", "test.echo", "--params", "[1]")
    assert "no user 'zed'" in refused("jobstate", "enqueue", "test.echo", "--owner", "zed")
    assert "ISO 8601" in refused("jobstate", "enqueue", "test.echo", "--run-after", "tomorrow")
    assert "ISO 8601" in refused("jobstate", "enqueue", "test.echo", "--run-after", "2026-13-45T00:00")
    message = refused("jobstate", "enqueue", "test.schema", "--params", '{"rows": "many"}')
    assert message == "enqueue: parameters: rows: Unknown field.; parameters: width: This field is required."
    assert not Job.objects.exists()


@pytest.mark.parametrize("when", ["", "   "])
def test_an_empty_run_after_is_refused_not_now(when: str) -> None:
    # `--run-after "$WHEN"` with $WHEN empty queued a job to run at once.
    message = refused("jobstate", "enqueue", "test.echo", "--run-after", when)
    assert message == "--run-after is empty: give an ISO 8601 time, or leave --run-after out to run it now"
    assert not Job.objects.exists()


@pytest.mark.parametrize("key", ["   ", "\t"])
def test_a_blank_key_is_refused_by_the_service_rule(key: str) -> None:
    # `--key "  "` queued a job with the key "  ".
    message = refused("jobstate", "enqueue", "test.echo", "--key", key)
    assert message == "enqueue: key: A key cannot be blank (only whitespace)."
    assert not Job.objects.exists()


@pytest.mark.parametrize("owner", ["", "   ", "\t"])
def test_an_empty_owner_is_refused_not_a_system_job(owner: str) -> None:
    # `--owner "$USER"` with $USER empty queued a job with no owner (a system job),
    # while `--key ''` was refused.
    message = refused("jobstate", "enqueue", "test.echo", "--owner", owner)
    assert message == "--owner is empty: give a user name, or leave --owner out for a system job"
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("jobstate", "enqueue", "test.echo", "--params", '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}"),
            "JSON",
        ),
        (("jobstate", "enqueue", "test.echo", "--params", '{"a": ' + "9" * 5000 + "}"), "JSON"),
        (("jobstate_workflow", "start", "wf.fixable", "--params", "[" * 50_000 + "]" * 50_000), "JSON"),
        (("jobstate", "enqueue", "test.echo", "--owner", "al\x00ice"), "no user"),
        (("jobstate", "enqueue", "test.echo", "--key", "k\x00"), "key"),
        (("jobstate", "enqueue", "test.echo", "--run-after", "9999-12-31T23:59:59-12:00"), "run_after"),
        (("jobstate_stuck", "--limit", str(10**23)), "--limit"),
        (("jobstate_prune", "--days", "nan"), "--days"),
        (("jobstate_prune", "--days", "1e10"), "--days"),
        (("jobstate_prune", "--batch", str(10**23)), "--batch"),
        (("jobstate_move_hot_columns", "--database", "nope"), "--database"),
        # Accepted (exit 0) where nothing was to do: on SQLite, with --check, or in place.
        (("jobstate_move_hot_columns", "--lock-timeout", "-1"), "--lock-timeout"),
        (("jobstate_move_hot_columns", "--check", "--lock-timeout", "nan"), "--lock-timeout"),
    ],
)
def test_bad_options_are_a_command_error_and_write_nothing(args: tuple[str, ...], says: str) -> None:
    # Each was a traceback: RecursionError, ValueError, DataError, OverflowError...
    assert says in refused(*args)
    assert not Job.objects.exists()


@pytest.mark.parametrize("params", ["null", "[1]", '"month"', "7"])
@pytest.mark.parametrize(
    "command", [("jobstate", "enqueue", "test.echo"), ("jobstate_workflow", "start", "wf.fixable")]
)
def test_params_that_are_not_a_json_object_are_refused(command: tuple[str, ...], params: str) -> None:
    # jobstate_workflow start queued a job with --params null (as {}) and named no option
    # for the others ("parameters: Parameters must be a JSON object.").
    message = refused(*command, "--params", params)
    assert message == '--params must be a JSON object, like \'{"month": "2026-10"}\''
    assert not Job.objects.exists()


# argv bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("jobstate", "enqueue", "test.echo", "--owner", "\udcff"), "no user"),
        (("jobstate", "enqueue", "test.echo", "--key", "k\udcff"), "key"),
        (("jobstate", "enqueue", "test.echo", "--reason", "\udcff"), "reason"),
        (("jobstate", "enqueue", "test.echo", "--reason", "a\x00b"), "reason"),
        (("jobstate", "enqueue", "test.\udcff"), "kind"),
        (("jobstate", "show", "\udcff"), "job"),
        (("jobstate_workflow", "start", "wf.\udcff"), "kind"),
        (("jobstate_workflow", "skip", "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43", "\udcff"), "step"),
        (("jobstate_move_hot_columns", "--database", "\udcff"), "database"),
    ],
)
def test_undecodable_text_is_a_command_error(args: tuple[str, ...], says: str) -> None:
    message = refused(*args)
    assert says in message and "UTF-8" in message
    assert not Job.objects.exists()


@pytest.mark.parametrize("command", ["enqueue", "cancel", "retry", "workflow retry", "workflow skip", "stop"])
def test_a_reason_longer_than_the_api_and_admin_take_is_refused(command: str) -> None:
    # It was recorded whole; the API and the admin refuse a reason over 1,000 characters.
    kind = "wf.five" if command.startswith(("workflow", "stop")) else "test.echo"
    job = failed(kind=kind) if "retry" in command else queued(kind=kind)
    args = {
        "enqueue": ("jobstate", "enqueue", "test.echo"),
        "cancel": ("jobstate", "cancel", str(job.pk)),
        "retry": ("jobstate", "retry", str(job.pk)),
        "workflow retry": ("jobstate_workflow", "retry", str(job.pk)),
        "workflow skip": ("jobstate_workflow", "skip", str(job.pk), "s1"),
        "stop": ("jobstate_workflow", "stop", str(job.pk)),
    }[command]
    jobs, events = Job.objects.count(), JobEvent.objects.count()
    assert refused(*args, "--reason", "r" * 1001) == (
        "--reason is 1,001 characters long: at most 1,000, as in the API and the admin"
    )
    assert (Job.objects.count(), JobEvent.objects.count()) == (jobs, events)
    run("jobstate", "enqueue", "test.echo", "--reason", "r" * 1000)
    assert JobEvent.objects.latest("id").reason == "r" * 1000


def test_cancel_queued_and_running_jobs() -> None:
    waiting, running = queued(), processing()
    out, _ = run("jobstate", "cancel", str(waiting.pk), "--reason", "not needed")
    assert out.strip() == f"cancelled {waiting.pk}"
    event = JobEvent.objects.filter(job=waiting).latest("id")
    assert (event.to_status, event.reason) == (Status.CANCELLED, "not needed")
    assert event.actor_label.startswith("cli:")
    stops = (
        "its worker stops it at the next check (a heartbeat or progress report), or by force "
        "CANCEL_GRACE_SECONDS (30s) later"
    )
    out, _ = run("jobstate", "cancel", str(running.pk))
    assert out.strip() == f"cancel requested for {running.pk}: {stops}"
    asked = Job.objects.get(pk=running.pk).cancel_requested_at
    assert asked is not None
    # A second cancel said "cancel requested" again, as if it had asked now.
    with override_settings(JOBSTATE={"CANCEL_GRACE_SECONDS": 2.5}):
        out, _ = run("jobstate", "cancel", str(running.pk))
    when = timezone.localtime(asked).strftime("%Y-%m-%d %H:%M:%S")
    assert out.strip() == (
        f"cancel already requested for {running.pk} at {when}: {stops.replace('(30s)', '(2.5s)')}"
    )
    assert Job.objects.get(pk=running.pk).cancel_requested_at == asked
    message = refused("jobstate", "cancel", str(waiting.pk))
    assert message == (
        "cancel refused: the job is cancelled; only a queued, waiting or running job can be cancelled"
    )


def test_cancel_of_a_job_waiting_for_its_children_is_at_once() -> None:
    # The help and the refusal said only a queued or running job could be cancelled.
    parent = processing()
    child = queued(parent=parent)
    services.suspend(parent, parent.lease_token)  # it waits for its child
    assert Job.objects.get(pk=parent.pk).status == Status.WAITING
    out, _ = run("jobstate", "cancel", str(parent.pk))
    assert out.strip() == f"cancelled {parent.pk}"
    assert Job.objects.get(pk=child.pk).status == Status.CANCELLED


def test_requeue_fail_and_cancel_now_from_the_command_line() -> None:
    # `jobstate requeue` was "invalid choice"; there was no fail nor force cancel.
    running, doomed, hung = processing(), queued(), processing()
    out, _ = run("jobstate", "requeue", str(running.pk), "--reason", "worker lost")
    when = timezone.localtime(running.lease_expires_at).strftime("%Y-%m-%d %H:%M:%S")
    assert out.strip() == (
        f"requeued {running.pk}: its next attempt starts after {when}, when its old lease would have "
        "run out (its worker's watchdog stops it by then)"
    )
    lost = processing(started=timezone.now() - timedelta(minutes=30), lease_seconds=60)
    assert run("jobstate", "requeue", str(lost.pk))[0].strip() == f"requeued {lost.pk}"
    out, _ = run("jobstate", "fail", str(doomed.pk), "--reason", "bad input")
    assert out.strip() == f"failed {doomed.pk}"
    assert Job.objects.get(pk=doomed.pk).error_message == "bad input"
    message = refused("jobstate", "cancel", str(hung.pk), "--now")
    assert message == (
        "cancel --now refused: the job is processing; only a running job whose cancel was requested "
        "can be cancelled now on behalf of its worker"
    )
    run("jobstate", "cancel", str(hung.pk))
    out, _ = run("jobstate", "cancel", str(hung.pk), "--now", "--reason", "worker hung")
    assert out.strip() == f"cancelled {hung.pk} on behalf of its worker"
    for job, status, reason in (
        (running, Status.QUEUED, "worker lost"),
        (doomed, Status.FAILED, "bad input"),
        (hung, Status.CANCELLED, "worker hung"),
    ):
        event = JobEvent.objects.filter(job=job).latest("id")
        assert (event.to_status, event.reason) == (status, reason)
        assert event.actor_label.startswith("cli:")
    assert refused("jobstate", "requeue", str(doomed.pk)) == (
        "requeue refused: the job is failed; only a running or waiting job can be requeued"
    )
    assert refused("jobstate", "fail", str(doomed.pk), "--reason", "again") == (
        "fail refused: the job is failed; only a queued, waiting or running job can be failed"
    )
    assert refused("jobstate", "fail", str(queued().pk), "--reason", " ") == (
        "--reason is empty: say why the job fails (stored as its error)"
    )


def test_requeue_of_a_waiting_job_wakes_it() -> None:
    parent = processing()
    queued(parent=parent)
    services.suspend(parent, parent.lease_token)
    out, _ = run("jobstate", "requeue", str(parent.pk))
    assert out.strip() == f"woke {parent.pk}: it runs again now"
    assert Job.objects.get(pk=parent.pk).status == Status.QUEUED


def test_retry_prints_the_new_job() -> None:
    old = failed()
    out, _ = run("jobstate", "retry", str(old.pk), "--reason", "disk cleaned")
    new = Job.objects.get(pk=out.strip())
    assert new.retry_of_id == old.pk and new.status == Status.QUEUED
    message = refused("jobstate", "retry", str(new.pk))
    assert message == "retry refused: the job is queued; only a finished job can be retried"


def test_kinds_prints_whole_seconds_without_a_fraction(temp_handler: Any) -> None:
    # A timeout of 60.0 (a float, as a task's may be) printed "timeout=60.0s".
    temp_handler("test.float_timeout", timeout=60.0, retry_backoff=30.0)
    temp_handler("test.half_timeout", timeout=0.5, retry_backoff=2.5)
    lines = run("jobstate", "kinds")[0].splitlines()
    whole = lines[lines.index("test.float_timeout") + 1].split(", ")
    assert "timeout=60s" in whole and "retry_backoff=30s" in whole
    half = lines[lines.index("test.half_timeout") + 1].split(", ")
    assert "timeout=0.5s" in half and "retry_backoff=2.5s" in half


def test_kinds_says_who_may_start_each_kind_through_the_api(temp_handler: Any) -> None:
    # The API answers unknown_kind for a registered kind it may not start, and the docs
    # send the developer to `jobstate kinds`, which listed the kind without its api policy.
    temp_handler("test.internal")
    temp_handler("test.public", api=True)
    temp_handler("test.by_perm", api="jobstate.view_job")
    lines = run("jobstate", "kinds")[0].splitlines()
    shown = {
        name: lines[lines.index(name) + 1].split(", ")
        for name in ("test.internal", "test.public", "test.by_perm")
    }
    assert "api=False" in shown["test.internal"]
    assert "api=True" in shown["test.public"]
    assert "api='jobstate.view_job'" in shown["test.by_perm"]


@pytest.mark.parametrize("action", ["cancel", "retry", "show"])
def test_bad_and_unknown_ids(action: str) -> None:
    assert refused("jobstate", action, "12ab").startswith("'12ab' is not a job id")
    missing = "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43"
    assert refused("jobstate", action, missing) == f"No job {missing}"


def test_kinds_lists_options() -> None:
    out, _ = run("jobstate", "kinds")
    lines = out.splitlines()
    echo = lines.index("test.echo")
    assert lines[echo + 1].split(", ")[:3] == ["  max_attempts=3", "timeout=600s", "concurrency=unlimited"]
    limited = lines.index("test.limited")
    assert "concurrency=2" in lines[limited + 1]
    schema = next(i for i, line in enumerate(lines) if line.startswith("test.schema"))
    assert "DRF serializer" in lines[schema] and "schema=SchemaParameters" in lines[schema + 1]


def test_show_prints_status_progress_attempts_and_history(user: Any) -> None:
    job = processing(user)
    services.report_progress(job, job.lease_token, 42, "page 4 of 10", step="pages")
    services.request_cancel(job, services.Actor("ops"), "wrong month")
    out, _ = run("jobstate", "show", str(job.pk))
    assert f"job        {job.pk}" in out
    assert "status     Processing (cancel requested)" in out
    assert "progress   42%  page 4 of 10  [step pages]" in out
    assert "attempts   1 of 3" in out and "owner      alice" in out
    history = out[out.index("history") :].splitlines()
    assert history[0] == "history    (3 transitions)"
    assert "-> queued" in history[1] and "queued -> processing" in history[2]
    assert "request_cancel" in history[3] and "ops  wrong month" in history[3]
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert (data["status"], data["progress"], data["attempts"]) == ("processing", 42, 1)
    assert [h["transition"] for h in data["history"]][-1] == "request_cancel"


def test_show_names_the_user_who_acted_as_the_admin_does(user: Any) -> None:
    # It printed "api" where the admin's history shows "api (alice)".
    job = services.enqueue("test.echo", owner=user, actor=services.Actor.api(user))
    services.request_cancel(job, services.Actor("ops"), "")
    history = run("jobstate", "show", str(job.pk))[0].splitlines()[-2:]
    assert history[0].endswith(" enqueue           api (alice)") and history[1].endswith(" ops")
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert [(h["actor"], h["actor_user"]) for h in data["history"]] == [("api", "alice"), ("ops", None)]
    for event in JobEvent.objects.select_related("actor"):
        assert strip_tags(EventColumns().actor_display(event)) == event.actor_text


def test_show_json_has_what_the_text_shows() -> None:
    # The text prints "run after", "retry of" and how many transitions there are in all
    # (only the latest 50 listed); --json, "the same as JSON", had none of them.
    later = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    old = failed()
    new = Job.objects.get(pk=run("jobstate", "retry", str(old.pk))[0].strip())
    Job.objects.filter(pk=new.pk).update(run_after=later)
    text = run("jobstate", "show", str(new.pk))[0]
    assert f"retry of   {old.pk}" in text and "run after" in text
    data = json.loads(run("jobstate", "show", str(new.pk), "--json")[0])
    assert data["retry_of"] == str(old.pk) and data["run_after"] == later.isoformat().replace("+00:00", "Z")
    assert data["history_total"] == len(data["history"]) == 1
    data = json.loads(run("jobstate", "show", str(old.pk), "--json")[0])
    assert data["retry_of"] is None and data["history_total"] == 3


def test_show_prints_the_stored_traceback_last_and_in_the_json() -> None:
    # It printed "error      OSError: ..." and not the traceback, which only the admin showed.
    job = failed()
    lines = run("jobstate", "show", str(job.pk))[0].splitlines()
    assert "error      OSError: boom: disk full" in lines
    assert lines[-3:] == ["traceback", "  Traceback...", "  OSError: boom"]
    assert json.loads(run("jobstate", "show", str(job.pk), "--json")[0])["traceback"] == job.traceback
    done = completed()
    assert not any(
        line.startswith("traceback") for line in run("jobstate", "show", str(done.pk))[0].splitlines()
    )
    assert json.loads(run("jobstate", "show", str(done.pk), "--json")[0])["traceback"] == ""


def test_show_has_the_requests_and_related_jobs_the_admin_job_page_has() -> None:
    # It showed no stop request and no parent, and a cancel request without its time.
    parent = processing()
    job = processing(parent=parent)
    services.request_stop(job, services.Actor("ops"))
    services.request_cancel(job, services.Actor("ops"))
    queued(parent=job)
    queued(parent=job)
    job.refresh_from_db()
    lines = run("jobstate", "show", str(job.pk))[0].splitlines()
    assert "status     Processing (cancel requested) (stop requested)" in lines
    [cancel] = [line for line in lines if line.startswith("cancel ")]
    assert cancel.startswith(f"cancel     requested {job.cancel_requested_at:%Y-%m-%d %H:%M:%S} (")
    assert cancel.endswith("s ago), not yet honoured by its worker")
    assert f"stop       requested {job.stop_requested_at:%Y-%m-%d %H:%M:%S}" in lines
    assert f"parent     {parent.pk}" in lines and "children   2 jobs" in lines
    assert not any(line.startswith(("retry of", "retried as")) for line in lines)
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert data["parent"] == str(parent.pk) and data["children"] == 2 and data["retried_as"] == []
    assert data["stop_requested_at"] and data["cancel_requested_at"]

    old = failed()
    new = Job.objects.get(pk=run("jobstate", "retry", str(old.pk))[0].strip())
    lines = run("jobstate", "show", str(old.pk))[0].splitlines()
    assert f"retried as {new.pk}" in lines
    assert not any(line.startswith(("parent", "children", "cancel ", "stop ")) for line in lines)
    data = json.loads(run("jobstate", "show", str(old.pk), "--json")[0])
    assert (data["retried_as"], data["parent"], data["children"]) == ([str(new.pk)], None, 0)
    assert data["stop_requested_at"] is None


def test_show_prints_the_watermarks_that_are_set() -> None:
    # It printed none of them: an operator could not tell why a keyed job re-ran.
    plain = queued()
    lines = run("jobstate", "show", str(plain.pk))[0].splitlines()
    assert not any(line.startswith("watermarks") for line in lines)
    data = json.loads(run("jobstate", "show", str(plain.pk), "--json")[0])
    assert (data["input_watermark"], data["claimed_watermark"], data["last_success_watermark"]) == (
        None,
        None,
        None,
    )
    job, _ = services.get_or_enqueue("test.echo", {}, key="k1", watermark=0)
    lines = run("jobstate", "show", str(job.pk))[0].splitlines()
    assert "watermarks input 0" in lines
    Job.objects.filter(pk=job.pk).update(input_watermark=7, claimed_watermark=6, last_success_watermark=5)
    lines = run("jobstate", "show", str(job.pk))[0].splitlines()
    assert "watermarks input 7  claimed 6  last success 5" in lines
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert (data["input_watermark"], data["claimed_watermark"], data["last_success_watermark"]) == (7, 6, 5)


def test_show_lists_the_job_s_assets_as_the_api_does(settings: Any, tmp_path: Any) -> None:
    # It printed none: the files a job made were only in the admin and the API.
    settings.MEDIA_ROOT = tmp_path
    job = processing()
    lost = services.add_asset(job, asset_type="report", name="lost.csv", content=b"x", token=job.lease_token)
    Asset.objects.filter(pk=lost.pk).update(attempt_lost=True)  # hidden from the results, as in the API
    report = services.add_asset(
        job, asset_type="report", name="report.csv", content=b"x" * 2048, token=job.lease_token
    )
    link = services.add_asset(job, asset_type="link", url="https://example.org/data.json")
    out = run("jobstate", "show", str(job.pk))[0]
    assets = out[out.index("\nassets") + 1 :].splitlines()
    assert assets[0] == "assets     (2 assets)" and len(assets) == 3
    assert assets[1].split()[2:] == ["2.0", "KB", "text/csv", "report", "report.csv"]
    assert assets[2].split()[2:] == ["-", "application/json", "link", "data.json", link.url]
    assert "lost.csv" not in out and report.storage_path not in out and str(job.pk) + "/" not in out
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert data["assets_total"] == 2
    first, second = data["assets"]
    assert first == {
        "id": str(report.pk),
        "asset_type": "report",
        "name": "report.csv",
        "content_type": "text/csv",
        "size": 2048,
        "sha256": report.sha256,
        "url": None,
        "metadata": {},
        "created_at": first["created_at"],
    }
    assert first["created_at"].startswith(f"{report.created_at:%Y-%m-%dT%H:%M:%S}")
    assert (second["name"], second["size"], second["url"]) == ("data.json", 0, link.url)

    plain = queued()
    out = run("jobstate", "show", str(plain.pk))[0]
    assert not any(line.startswith("assets") for line in out.splitlines())
    data = json.loads(run("jobstate", "show", str(plain.pk), "--json")[0])
    assert (data["assets_total"], data["assets"]) == (0, [])


def test_show_lists_the_first_50_assets_and_says_how_many_more() -> None:
    job = processing()
    for i in range(53):
        services.add_asset(job, asset_type="link", url=f"https://example.org/{i}.json")
    first = [a.name for a in services.result_assets(job)[:50]]
    out = run("jobstate", "show", str(job.pk))[0]
    assets = out[out.index("\nassets") + 1 :].splitlines()
    assert assets[0] == "assets     (53 assets)" and assets[-1] == "  ... and 3 more"
    assert [line.split()[-2] for line in assets[1:-1]] == first
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert data["assets_total"] == 53 and [a["name"] for a in data["assets"]] == first


def test_show_of_a_running_job_has_its_lease_heartbeat_worker_and_pending_cancel() -> None:
    # It showed the worker only: no lease, no heartbeat, a cancel request as any other time.
    job = processing(started=timezone.now() - timedelta(minutes=3), lease_seconds=600, worker="w-7")
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=20))
    services.request_cancel(job, services.Actor("ops"), "")
    job.refresh_from_db()
    lines = run("jobstate", "show", str(job.pk))[0].splitlines()
    field = {line[:11].strip(): line[11:] for line in lines if not line.startswith(" ")}
    assert field["worker"] == "w-7"
    assert field["lease"].startswith(
        f"expires {timezone.localtime(job.lease_expires_at):%Y-%m-%d %H:%M:%S} (in 6"
    )
    assert field["heartbeat"].startswith(f"{timezone.localtime(job.heartbeat_at):%Y-%m-%d %H:%M:%S} (2")
    assert field["heartbeat"].endswith("s ago)")
    assert field["cancel"].endswith("s ago), not yet honoured by its worker")
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert (data["worker_id"], data["cancel_pending"]) == ("w-7", True)
    assert data["lease_expires_at"].startswith(f"{job.lease_expires_at:%Y-%m-%dT%H:%M:%S}")
    assert data["heartbeat_at"].startswith(f"{job.heartbeat_at:%Y-%m-%dT%H:%M:%S}")

    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5, seconds=30))
    out = run("jobstate", "show", str(job.pk))[0]
    assert "lease      expired " in out and "(5 minutes ago)" in out
    services.force_cancel(job, "ops")
    out = run("jobstate", "show", str(job.pk))[0]
    assert "lease " not in out and "heartbeat " not in out and "not yet honoured" not in out
    data = json.loads(run("jobstate", "show", str(job.pk), "--json")[0])
    assert (data["lease_expires_at"], data["heartbeat_at"], data["cancel_pending"]) == (None, None, False)


@override_settings(USE_TZ=False)
def test_show_of_a_running_job_with_use_tz_false() -> None:
    job = services.enqueue("test.echo", {})
    services.start(job, "w-1", lease_seconds=600)
    job.refresh_from_db()
    out, _ = run("jobstate", "show", str(job.pk))
    assert f"lease      expires {job.lease_expires_at:%Y-%m-%d %H:%M:%S} (in 9 minutes" in out


@override_settings(USE_TZ=False)
def test_show_with_use_tz_false() -> None:
    # Every time is naive then: "localtime() cannot be applied to a naive datetime", a traceback.
    run("jobstate", "cancel", str(queued().pk))
    job = Job.objects.get()
    out, _ = run("jobstate", "show", str(job.pk))
    assert f"created    {job.created_at:%Y-%m-%d %H:%M:%S}" in out
    assert f"finished   {job.finished_at:%Y-%m-%d %H:%M:%S}" in out
    assert "history    (2 transitions)" in out and "queued -> cancelled" in out
    assert json.loads(run("jobstate", "show", str(job.pk), "--json")[0])["status"] == "cancelled"


def test_workflow_state_of_a_plain_job_and_bad_ids() -> None:
    job = queued()
    message = refused("jobstate_workflow", "state", str(job.pk))
    assert (
        message == f"Job {job.pk} (test.echo) is not a workflow; `manage.py jobstate show {job.pk}` shows it"
    )
    assert refused("jobstate_workflow", "state", "nope").startswith("'nope' is not a job id")
    assert refused("jobstate_workflow", "skip", "nope", "x").startswith("'nope' is not a job id")
    missing = "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43"
    assert refused("jobstate_workflow", "retry", missing) == f"No job {missing}"


def test_workflow_retry_and_skip_refused_by_the_job_s_status_say_why() -> None:
    # They said "Cannot move job from 'queued' to 'queued' (retry_from)".
    job = queued(kind="wf.fixable")
    message = refused("jobstate_workflow", "retry", str(job.pk), "--from", "two")
    assert message == "retry refused: the job is queued; only a finished workflow can be retried"
    ended = failed(kind="wf.fixable")
    message = refused("jobstate_workflow", "skip", str(ended.pk), "two")
    assert message == (
        "skip refused: the job is failed; only a step of a queued or waiting workflow can be skipped "
        "(of a finished one: retry --from STEP --skip STEP)"
    )
    assert Job.objects.count() == 2 and not JobStep.objects.filter(status="skipped").exists()


def test_workflow_stop_says_when_it_cancelled_a_job_that_never_served() -> None:
    # request_stop cancels a queued job that never served: the command said "stop requested".
    job = queued()
    out, _ = run("jobstate_workflow", "stop", str(job.pk), "--reason", "not needed")
    assert out.strip() == f"cancelled {job.pk}: it had not served yet"
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    running = processing()
    out, _ = run("jobstate_workflow", "stop", str(running.pk))
    assert out.strip() == f"stop requested for {running.pk}"
    assert Job.objects.get(pk=running.pk).stop_requested_at is not None


def subcommand_help(command: str, action: str) -> str:
    parser = load_command_class("jobstate", command).create_parser("manage.py", command)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(str(choice.help) for choice in subparsers._choices_actions if choice.dest == action)


def test_workflow_stop_help_says_a_job_that_never_served_is_cancelled() -> None:
    # It said "Ask a running (serving) job to stop gracefully": the queued job below is cancelled.
    text = subcommand_help("jobstate_workflow", "stop")
    assert "never served is cancelled instead" in text and "ends completed" in text
    assert "one that never served is cancelled" in load_command_class("jobstate", "jobstate_workflow").help
    job = queued()
    run("jobstate_workflow", "stop", str(job.pk))
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


def test_workflow_stop_of_a_job_that_ends_meanwhile_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # The job completes between the command's read and the stop's write: it printed
    # "stop requested" for a job with nothing left to stop.
    running = processing()
    real_get = control._get

    def completes_first(job: Any) -> Job:
        found = real_get(job)
        if found.status == Status.PROCESSING:
            services.complete(found, found.lease_token, {"done": True})
        return found

    monkeypatch.setattr(control, "_get", completes_first)
    message = refused("jobstate_workflow", "stop", str(running.pk))
    assert message == f"stop refused: job {running.pk} has ended (completed)"
    assert Job.objects.get(pk=running.pk).stop_requested_at is None


def test_retry_of_a_job_deleted_meanwhile_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # Retention deletes the job between the command's read and the retry's lock.
    old = failed()
    real = retries.lock_parent

    def retention_runs_meanwhile(job: Job) -> Any:
        Job.objects.filter(pk=old.pk).delete()
        return real(job)

    monkeypatch.setattr(retries, "lock_parent", retention_runs_meanwhile)
    message = refused("jobstate", "retry", str(old.pk))
    assert message == f"retry: Job {old.pk} no longer exists (deleted meanwhile)"


def test_a_second_retry_from_the_command_line_names_the_first() -> None:
    old = failed()
    first = run("jobstate", "retry", str(old.pk))[0].strip()
    message = refused("jobstate", "retry", str(old.pk))
    assert message == f"retry: Job {old.pk} was already retried as job {first}: retry that one instead."


def test_retry_of_a_job_whose_kind_is_gone_says_so() -> None:
    # It said "retry: Unknown job kind 'test.gone'." as if the command had a kind to blame;
    # the REST API's message says why.
    old = failed()
    Job.objects.filter(pk=old.pk).update(kind="test.gone")  # its handler since removed from the code
    message = refused("jobstate", "retry", str(old.pk))
    assert message == "retry: This job's kind 'test.gone' is no longer registered: it cannot be retried."
    assert not Job.objects.filter(retry_of=old.pk).exists()


def _without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _without_help(sub, f"{path} {name}")
        elif not action.help:
            missing.append(f"{path} {action.dest}")
    return missing


def test_every_argument_of_the_jobstate_commands_has_a_help_text() -> None:
    # jobstate_workflow's positional arguments and --reason, and jobstate_move_hot_columns'
    # --database, had none (`--help` listed them bare).
    names = sorted(name for name, app in get_commands().items() if app == "jobstate")
    assert "jobstate_workflow" in names and "jobstate_move_hot_columns" in names
    missing = []
    for name in names:
        missing += _without_help(load_command_class("jobstate", name).create_parser("manage.py", name), name)
    assert missing == []
