"""Stuck-job detection (jobstate.stuck), its admin page and remedies, and the
``jobstate_stuck`` command."""

from __future__ import annotations

import json
import shlex
from datetime import timedelta
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from jobstate import registry, services, stuck
from jobstate.ids import short
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from tests.admin_support import ago, completed, expired, failed, grant, processing, queued

pytestmark = pytest.mark.django_db

STUCK = reverse("admin:jobstate_job_stuck")
REMEDY = reverse("admin:jobstate_job_stuck_remedy")
REAP = reverse("admin:jobstate_job_reap")
CONFIRMED = {"confirmed": "yes"}


def reasons(now: Any = None) -> dict[str, str]:
    """{job id: reason code} for every finding."""
    return {str(f.job.pk): f.reason for f in stuck.find_stuck(now)}


def waiting_parent(*, lost_wakeup: bool) -> Job:
    """A job waiting for its child; with ``lost_wakeup`` the child ended without
    waking it (written behind the service layer's back, as a lost wake-up would)."""
    parent = processing(lease_seconds=3600)
    child = queued(parent=parent, run_after=timezone.now() + timedelta(hours=1))
    services.suspend(parent, parent.lease_token)
    if lost_wakeup:
        Job.objects.filter(pk=child.pk).update(status=Status.CANCELLED, finished_at=timezone.now())
    parent.refresh_from_db()
    assert parent.status == Status.WAITING
    return parent


def scenario(temp_handler: Any) -> dict[str, Job]:
    """One job per reason, plus healthy ones that must not be reported."""
    temp_handler("test.slow", timeout=60)
    temp_handler("test.orphan")
    jobs: dict[str, Job] = {}
    jobs["lease_expired"] = expired()
    # Heartbeat 10 minutes old, lease (1 h) still valid.
    jobs["no_heartbeat"] = processing(started=ago(minutes=10), lease_seconds=3600)
    # A 60 s handler running for 5 minutes, still heartbeating.
    slow = processing(kind="test.slow", started=ago(minutes=5), lease_seconds=3600)
    services.heartbeat(slow, slow.lease_token, lease_seconds=3600)
    jobs["past_timeout"] = slow
    # Past its timeout and silent too (lease still valid): the timeout is the reason.
    jobs["past_timeout:silent"] = processing(kind="test.slow", started=ago(minutes=10), lease_seconds=3600)
    hung = processing(started=ago(minutes=11), lease_seconds=3600)
    services.request_cancel(hung, "ops", "stop it")
    Job.objects.filter(pk=hung.pk).update(cancel_requested_at=ago(minutes=10))  # time travel
    jobs["cancel_unhonoured"] = hung
    jobs["queued_no_worker"] = queued(kind="test.orphan", run_after=ago(hours=1))
    jobs["recently_failed"] = failed(error="out of memory")
    jobs["waiting_no_children"] = waiting_parent(lost_wakeup=True)
    # Healthy: running with fresh heartbeat, queued for later, done, operator-failed, retried.
    jobs["ok_running"] = processing()
    jobs["ok_waiting"] = waiting_parent(lost_wakeup=False)
    jobs["ok_future"] = queued(run_after=timezone.now() + timedelta(hours=1))
    jobs["ok_done"] = completed()
    jobs["ok_operator_failed"] = services.force_fail(queued(), "ops", "bad data")
    retried = failed(error="flaky")
    services.retry(retried, "ops", "again")
    jobs["ok_retried"] = retried
    # Failed with an idempotency key that a later enqueue took: that job carries on.
    superseded = failed(error="flaky", key="nightly")
    services.enqueue(superseded.kind, {"n": 2}, key="nightly")
    jobs["ok_superseded"] = superseded
    return jobs


def test_each_reason_is_found_once(temp_handler: Any) -> None:
    jobs = scenario(temp_handler)
    found = reasons()
    expected = {str(j.pk): name.split(":")[0] for name, j in jobs.items() if not name.startswith("ok_")}
    # The retry of ok_retried is a fresh queued job: not stuck either.
    assert found == expected


def test_a_keyed_failure_stays_reported_until_a_later_job_takes_its_key(django_user_model: Any) -> None:
    # Keys are scoped per owner: another owner's job with the same key supersedes nothing.
    alice, bob = (django_user_model.objects.create_user(name) for name in ("alice", "bob"))
    mine = failed(alice, key="report")
    system = failed(key="report")
    services.enqueue(mine.kind, {"n": 2}, owner=bob, key="report")
    assert reasons() == {str(mine.pk): "recently_failed", str(system.pk): "recently_failed"}
    assert [stuck.check(job) is not None for job in (mine, system)] == [True, True]
    services.enqueue(mine.kind, {"n": 2}, owner=alice, key="report")
    assert reasons() == {str(system.pk): "recently_failed"}
    services.enqueue(system.kind, {"n": 2}, key="report")
    assert reasons() == {}
    assert [stuck.check(job) for job in (mine, system)] == [None, None]


def test_a_failed_child_of_a_failed_parent_is_not_offered_a_retry_that_is_refused(
    admin_client: Any,
) -> None:
    # Its retry is refused ("retry the parent instead"), and the parent's retry makes
    # new children: listed, it stayed on the page (and in jobstate_stuck) for a day.
    parent = processing()
    child = queued(parent=parent)
    services.suspend(parent, parent.lease_token)
    child = services.start(child, "w-child")
    services.fail(child, child.lease_token, "boom", retry=False)
    parent = services.start(parent, "w-parent")
    services.fail(parent, parent.lease_token, "a child failed", retry=False)
    assert reasons() == {str(parent.pk): "recently_failed"}
    assert stuck.check(Job.objects.get(pk=child.pk)) is None
    assert stuck.count_stuck()[stuck.RECENTLY_FAILED] == 1
    # A completed parent lets its failed child be retried: that one stays reported.
    other = processing()
    kid = queued(parent=other)
    kid = services.start(kid, "w-kid")
    services.fail(kid, kid.lease_token, "boom", retry=False)
    services.complete(other, other.lease_token, {})
    assert reasons()[str(kid.pk)] == "recently_failed"
    response = admin_client.post(REMEDY, {"job": str(kid.pk), "operation": "retry"})
    assert Job.objects.filter(retry_of=kid).exists(), [str(m) for m in get_messages(response.wsgi_request)]


def test_python_check_agrees_with_the_queries(temp_handler: Any) -> None:
    scenario(temp_handler)
    now = timezone.now()
    ctx = stuck.Context(now)
    for job in Job.objects.all():
        finding = stuck.check(job, ctx=ctx)
        matching = [
            r.code
            for r in stuck.REASONS
            if Job.objects.filter(pk=job.pk).filter(stuck.stuck_q(r.code, ctx)).exists()
        ]
        assert matching == ([finding.reason] if finding else []), (job, matching, finding)


def test_time_travel_with_now() -> None:
    job = processing(lease_seconds=60)
    assert reasons() == {}
    later = timezone.now() + timedelta(minutes=2)
    assert reasons(later) == {str(job.pk): "lease_expired"}


def test_cancel_unhonoured_wins_over_lease_expired() -> None:
    job = expired()
    services.request_cancel(job, "ops", "stop")
    assert reasons(timezone.now() + timedelta(minutes=5)) == {str(job.pk): "cancel_unhonoured"}


def test_queued_job_of_a_served_kind_is_backlog_not_stuck() -> None:
    waiting = queued(run_after=ago(hours=1))
    assert reasons() == {str(waiting.pk): "queued_no_worker"}
    processing()  # a worker is running a test.echo job right now
    assert reasons() == {}


def test_queued_job_of_a_kind_that_finished_lately_is_backlog_not_stuck(temp_handler: Any) -> None:
    temp_handler("test.orphan")
    waiting = queued(kind="test.orphan", run_after=ago(hours=1))
    assert reasons() == {str(waiting.pk): "queued_no_worker"}
    completed(kind="test.orphan")  # a worker ran one a moment ago
    assert reasons() == {}


def test_the_filter_and_the_check_agree_within_one_context(temp_handler: Any) -> None:
    temp_handler("test.orphan")
    waiting = queued(kind="test.orphan", run_after=ago(hours=1))
    ctx = stuck.Context()
    assert list(Job.objects.filter(stuck.stuck_q(stuck.QUEUED_NO_WORKER, ctx))) == [waiting]
    completed(kind="test.orphan")  # after the context looked: neither sees it
    finding = stuck.check(waiting, ctx=ctx)
    assert finding is not None and finding.reason == stuck.QUEUED_NO_WORKER


def test_thresholds_are_settings() -> None:
    job = processing(started=ago(minutes=3), lease_seconds=3600)
    assert reasons() == {str(job.pk): "no_heartbeat"}  # default 120 s
    with override_settings(JOBSTATE={"STUCK_NO_HEARTBEAT_SECONDS": 600}):
        assert reasons() == {}
    old = failed()
    with override_settings(JOBSTATE={"STUCK_RECENT_FAILURE_SECONDS": 1}):
        assert str(old.pk) not in reasons(timezone.now() + timedelta(seconds=5))


def test_counts_and_filters(temp_handler: Any) -> None:
    scenario(temp_handler)
    counts = stuck.count_stuck()
    # (No kind is paused here: tests/test_kind_pause.py finds queued_kind_paused.)
    expected = {"past_timeout": 2, "queued_kind_paused": 0}
    assert counts == {r.code: expected.get(r.code, 1) for r in stuck.REASONS}
    assert Job.objects.filter(stuck.any_stuck_q()).count() == 8
    assert stuck.count_stuck(cap=0)[stuck.LEASE_EXPIRED] == 0
    finding = stuck.find_stuck(codes=[stuck.RECENTLY_FAILED])[0]
    assert finding.as_dict()["remedy"] == "retry" and "out of memory" in finding.text


@pytest.mark.parametrize("limit", [0, 1, 5])
@pytest.mark.parametrize("cap", [0, 1, 100])
@pytest.mark.parametrize(
    "codes", [None, ["past_timeout"], ["no_heartbeat", "past_timeout", "recently_failed"]]
)
def test_survey_lists_and_counts_what_each_reason_filter_finds(
    temp_handler: Any, limit: int, cap: int, codes: list[str] | None
) -> None:
    scenario(temp_handler)
    ctx = stuck.Context()
    findings, counts = stuck.survey(limit=limit, cap=cap, codes=codes, ctx=ctx)
    wanted = [r for r in stuck.REASONS if codes is None or r.code in codes]
    expected = [
        (job.pk, r.code)
        for r in wanted
        for job in Job.objects.filter(stuck.stuck_q(r.code, ctx)).order_by(*r.order_by, "pk")[:limit]
    ]
    assert [(f.job.pk, f.reason) for f in findings] == expected
    assert counts == {
        r.code: min(cap, Job.objects.filter(stuck.stuck_q(r.code, ctx)).count()) for r in wanted
    }
    assert [(f.job.pk, f.reason) for f in stuck.find_stuck(limit=limit, codes=codes, ctx=ctx)] == expected
    if codes is None:
        assert len(findings) == (8 if limit == 5 else 7 * limit)  # past_timeout holds two


def jit() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        row = cursor.fetchone()
    return str(row[0] if row else None)


def check_no_jit() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("JIT is PostgreSQL's")
    before = jit()
    assert before != "off"
    with stuck.no_jit():
        assert jit() == "off"
    assert jit() == before


def test_stuck_queries_run_without_jit_inside_a_transaction() -> None:
    check_no_jit()  # (each test runs in a transaction)


@pytest.mark.django_db(transaction=True)
def test_stuck_queries_run_without_jit_in_autocommit() -> None:
    check_no_jit()


# --- the page -----------------------------------------------------------------


def test_stuck_page_lists_each_reason(admin_client: Any, temp_handler: Any) -> None:
    jobs = scenario(temp_handler)
    response = admin_client.get(STUCK)
    assert response.status_code == 200
    html = response.content.decode()
    for name, job in jobs.items():
        row = f'data-job="{job.pk}" data-reason="{name.split(":")[0]}"'
        assert (row in html) is not name.startswith("ok_"), name
    for r in stuck.REASONS:
        assert escape(r.title) in html
    assert 'value="requeue"' in html and 'value="force_cancel"' in html and 'value="retry"' in html
    assert "Run the reaper now (1 expired)" in html


def remedy(client: Any, job: Job, operation: str) -> Any:
    return client.post(REMEDY, {"job": str(job.pk), "operation": operation})


def test_one_click_requeue_records_admin_and_reason(admin_client: Any, admin_user: Any) -> None:
    job = expired()
    response = remedy(admin_client, job, "requeue")
    assert response.status_code == 302 and response["Location"] == STUCK
    job.refresh_from_db()
    assert job.status == Status.QUEUED
    event = JobEvent.objects.filter(job=job).latest("created_at", "id")
    assert (event.transition, event.actor, event.actor_label) == ("requeue", admin_user, "admin")
    assert event.reason == "stuck remedy (lease expired (worker lost))"
    assert str(job.pk) not in admin_client.get(STUCK).content.decode()


def test_one_click_wakes_a_job_waiting_for_children_that_all_ended(
    admin_client: Any, admin_user: Any
) -> None:
    job = waiting_parent(lost_wakeup=True)
    assert reasons() == {str(job.pk): "waiting_no_children"}
    response = remedy(admin_client, job, "requeue")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Status.QUEUED
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_status, event.transition, event.actor) == ("waiting", "wake", admin_user)


def test_one_click_force_cancel_and_retry(admin_client: Any, admin_user: Any) -> None:
    hung = processing(started=ago(minutes=11), lease_seconds=3600)
    services.request_cancel(hung, "ops", "stop")
    Job.objects.filter(pk=hung.pk).update(cancel_requested_at=ago(minutes=10))  # unhonoured since
    remedy(admin_client, hung, "force_cancel")
    assert Job.objects.get(pk=hung.pk).status == Status.CANCELLED
    dead = failed()
    remedy(admin_client, dead, "retry")
    remedy(admin_client, dead, "retry")  # a second click, from the same page: refused
    new = Job.objects.get(retry_of=dead)
    assert JobEvent.objects.get(job=new).actor == admin_user
    assert str(dead.pk) not in {str(f.job.pk) for f in stuck.find_stuck()}


def test_one_click_cancel_of_a_queued_job_no_worker_serves(
    admin_client: Any, admin_user: Any, temp_handler: Any
) -> None:
    temp_handler("test.orphan")
    job = queued(kind="test.orphan", run_after=ago(hours=1))
    html = admin_client.get(STUCK).content.decode()
    section = html.split('id="reason-queued_no_worker"', 1)[1].split("</section>", 1)[0]
    assert f'data-job="{job.pk}"' in section
    assert 'name="operation" value="cancel"' in section and ">Cancel</button>" in section
    response = remedy(admin_client, job, "cancel")
    assert response.status_code == 302 and response["Location"] == STUCK
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    event = JobEvent.objects.filter(job=job).latest("created_at", "id")
    assert (event.transition, event.actor, event.actor_label) == ("cancel", admin_user, "admin")
    assert event.reason == "stuck remedy (queued past due, no worker serving its kind)"
    assert str(job.pk) not in admin_client.get(STUCK).content.decode()


def test_the_cancel_remedy_needs_the_cancel_permission_and_a_queued_job(
    client: Any, viewer: Any, operator: Any, temp_handler: Any
) -> None:
    temp_handler("test.orphan")
    job = queued(kind="test.orphan", run_after=ago(hours=1))
    client.force_login(viewer)
    assert 'value="cancel"' not in client.get(STUCK).content.decode()
    assert remedy(client, job, "cancel").status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    # A job that a worker picked up meanwhile is not cancelled by the stale click.
    client.force_login(operator)
    started = services.start(job, "w-late")
    response = remedy(client, started, "cancel")
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert messages == ["Cancel refused: the job is processing now; open it to cancel it."]
    after = Job.objects.get(pk=job.pk)
    assert after.status == Status.PROCESSING and after.cancel_requested_at is None


def test_remedy_refused_when_state_moved_on(admin_client: Any) -> None:
    job = completed()
    response = remedy(admin_client, job, "requeue")
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("This job is no longer stuck that way" in m for m in messages)
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED


def test_a_remedy_that_is_not_the_jobs_own_is_refused(admin_client: Any) -> None:
    # Force cancel on a healthy running job (no cancel requested): it ended at once,
    # its handler never asked to stop.
    job = processing(lease_seconds=3600)
    response = remedy(admin_client, job, "force_cancel")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and not JobEvent.objects.filter(job=job, transition="cancel")


def test_remedy_needs_post_permission_and_a_real_job(client: Any, viewer: Any, operator: Any) -> None:
    job = expired()
    client.force_login(viewer)
    assert client.get(STUCK).status_code == 200
    assert 'value="requeue"' not in client.get(STUCK).content.decode()
    assert remedy(client, job, "requeue").status_code == 403
    assert client.post(REAP).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING
    client.force_login(operator)
    assert client.get(REMEDY).status_code == 405
    assert remedy(client, job, "complete").status_code == 403  # not a remedy
    response = client.post(REMEDY, {"job": "not-a-uuid", "operation": "requeue"})
    assert response.status_code == 302
    assert remedy(client, job, "requeue").status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_csrf_is_enforced(operator: Any) -> None:
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    job = expired()
    assert remedy(client, job, "requeue").status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING


def test_run_the_reaper_now(admin_client: Any) -> None:
    a = expired()
    b = expired(max_attempts=1)
    response = admin_client.post(REAP, CONFIRMED)
    assert response.status_code == 302
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert "Reaper ran: 1 requeued, 1 failed (no attempt left), 0 cancelled (cancel was pending)." in messages
    assert Job.objects.get(pk=a.pk).status == Status.QUEUED
    assert Job.objects.get(pk=b.pk).status == Status.FAILED
    # Every admin button names the admin user in the history rows it writes; these
    # keep the reaper's label, by which the metrics count its actions.
    for job in (a, b):
        event = JobEvent.objects.filter(job=job).latest("created_at", "id")
        assert (event.actor_label, event.actor.username) == ("system:reaper", "admin"), job


def test_the_reaper_button_asks_to_confirm_first(admin_client: Any) -> None:
    # It acted at once on every expired job, from a button beside the page's headline.
    jobs = [expired(), expired()]
    assert 'id="js-reap"' in admin_client.get(STUCK).content.decode()
    response = admin_client.post(REAP)
    assert response.status_code == 200
    page = response.content.decode()
    assert "<strong>2</strong> jobs' leases have expired" in page
    assert 'name="confirmed" value="yes"' in page and 'id="js-confirm"' in page
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {Status.PROCESSING}
    assert not JobEvent.objects.filter(actor_label="system:reaper").exists()
    assert admin_client.post(REAP, CONFIRMED).status_code == 302
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {Status.QUEUED}


def test_a_remedys_message_names_its_job(admin_client: Any) -> None:
    # The page lists many jobs; "Job requeued." said not which.
    lost, dead = expired(), failed()
    said = [str(m) for m in get_messages(remedy(admin_client, lost, "requeue").wsgi_request)]
    assert said == [f"Job {short(lost.pk)} requeued."]
    said = [str(m) for m in get_messages(remedy(admin_client, dead, "retry").wsgi_request)]
    new = Job.objects.get(retry_of=dead)
    assert said[-1] == f"Job {short(dead.pk)} retried: the new job is {new.pk}."


def test_a_requeue_remedy_of_a_live_lease_says_when_the_next_attempt_starts(admin_client: Any) -> None:
    # The job page's Requeue said so; the stuck page's click only "requeued".
    from datetime import timedelta

    from django.utils import timezone

    job = processing(lease_seconds=600)
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    (said,) = [str(m) for m in get_messages(remedy(admin_client, job, "requeue").wsgi_request)]
    assert Job.objects.get(pk=job.pk).run_after > timezone.now()
    assert said.startswith(f"Job {short(job.pk)} requeued: its next attempt starts after ")


@pytest.mark.parametrize(
    "codenames", [("requeue_job",), ("view_job",), ("view_job", "cancel_job", "retry_job")]
)
def test_run_the_reaper_now_needs_view_and_requeue(
    client: Any, staff_user: Any, codenames: tuple[str, ...]
) -> None:
    # It requeues and fails jobs: the requeue operation's rule, which every operation
    # view checks with the job view permission (requeue_job alone passed).
    job = expired()
    client.force_login(grant(staff_user, *codenames))
    response = client.post(REAP, CONFIRMED)
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING
    assert not JobEvent.objects.filter(job=job, actor_label="system:reaper").exists()
    assert list(get_messages(response.wsgi_request)) == []
    if "view_job" in codenames:
        assert "Run the reaper now" not in client.get(STUCK).content.decode()


def test_run_the_reaper_now_says_when_more_remain(admin_client: Any, monkeypatch: Any) -> None:
    expired(), expired()
    real = services.requeue_expired
    monkeypatch.setattr(services, "requeue_expired", lambda **kw: real(**{**kw, "limit": 1}))
    messages = [str(m) for m in get_messages(admin_client.post(REAP, CONFIRMED).wsgi_request)]
    assert messages == [
        "Reaper ran: 1 requeued, 0 failed (no attempt left), 0 cancelled (cancel was pending). "
        "More expired jobs remain past the sweep's limit: run it again."
    ]


def test_job_page_shows_stuck_notice(admin_client: Any) -> None:
    job = expired()
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert 'id="js-stuck-notice"' in html and "Lease expired" in html
    html = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    assert "⚠ lease expired" in html


# --- the command ---------------------------------------------------------------


def run(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("jobstate_stuck", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_command_exit_codes_and_output() -> None:
    assert run() == (0, "No stuck jobs.\n")
    dead = failed(error="no space left")
    code, out = run()
    assert code == 1 and "recently_failed" in out and str(dead.pk) in out and "no space left" in out
    job = expired()
    code, out = run()
    assert code == 2 and str(job.pk) in out and "remedy: Requeue it" in out
    assert run("--ignore", "lease_expired")[0] == 1
    with pytest.raises(CommandError, match="leave no reason to check"):
        run("--reason", "recently_failed", "--ignore", "recently_failed")
    code, out = run("--json")
    payload = json.loads(out)
    assert code == 2 and payload["counts"]["lease_expired"] == 1
    assert {f["reason"] for f in payload["findings"]} == {"lease_expired", "recently_failed"}
    code, out = run("--counts")
    assert code == 2 and str(job.pk) not in out and "Lease expired (worker lost) [lease_expired]: 1" in out


def exit_status(*args: str) -> int:
    """The status ``manage.py jobstate_stuck ...`` exits with."""
    from jobstate.management.commands.jobstate_stuck import Command

    try:
        Command(stdout=StringIO(), stderr=StringIO()).run_from_argv(["manage.py", "jobstate_stuck", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.mark.django_db(transaction=True)  # run_from_argv closes the connections
def test_a_check_that_cannot_run_exits_3_not_a_finding_s_status(monkeypatch: Any) -> None:
    # A bad argument exited 2 (argparse), as if jobs were stuck; a CommandError or the
    # database down exited 1, as if jobs had failed.
    expired()
    assert exit_status("--skip-checks") == 2
    assert exit_status("--reason", "nope") == 3
    assert exit_status("--limit", "99999") == 3
    assert exit_status("--reason", "recently_failed", "--ignore", "recently_failed") == 3
    monkeypatch.setattr(stuck, "survey", mock.Mock(side_effect=DatabaseError("server closed")))
    assert exit_status("--skip-checks") == 3


def test_every_remedy_the_command_prints_runs_as_printed(temp_handler: Any) -> None:
    # It printed "Requeue it ..." and no command; `manage.py jobstate requeue` did not exist,
    # nor a force cancel or a fail.
    jobs = scenario(temp_handler)
    stuck_ids = {str(j.pk) for name, j in jobs.items() if not name.startswith("ok_")}
    live = {
        name: Job.objects.get(pk=jobs[name].pk).lease_expires_at for name in ("past_timeout", "no_heartbeat")
    }
    code, out = run()
    commands = [line.split("run: ", 1)[1] for line in out.splitlines() if line.startswith("    run: ")]
    assert code == 2 and len(commands) == len(stuck_ids)
    json_commands = [f["command"] for f in json.loads(run("--json")[1])["findings"]]
    assert sorted(json_commands) == sorted(commands)
    for command in commands:
        words = shlex.split(command)
        assert words[:3] == ["python", "manage.py", "jobstate"], command
        call_command(*words[2:], stdout=StringIO(), stderr=StringIO())  # a refusal raises
    remedied = JobEvent.objects.filter(reason__startswith="stuck remedy (").select_related("job")
    assert {e.actor_label[:4] for e in remedied} == {"cli:"}
    assert {str(e.job.retry_of_id or e.job_id) for e in remedied} == stuck_ids  # a retry: a new job
    # A requeue of a job whose lease still runs holds it until then, as its remedy says.
    for name, lease in live.items():
        assert "once its lease would have run out" in stuck.BY_CODE[name].remedy_text
        assert Job.objects.filter(pk=jobs[name].pk, status=Status.QUEUED, run_after=lease).exists()
    assert run() == (0, "No stuck jobs.\n")


def test_command_marks_capped_counts() -> None:
    for _ in range(3):
        expired()
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2}):
        code, out = run("--limit", "1")
    assert code == 2 and "[lease_expired]: 2+" in out and "... and 1+ more" in out


def test_command_writes_counts_with_thousands_separators(monkeypatch: Any) -> None:
    # It printed "[lease_expired]: 10000+" and "... and 9999+ more"; the admin's stuck
    # page writes "10,000+".
    job = expired()
    [finding] = stuck.find_stuck()
    counted = {r.code: 0 for r in stuck.REASONS} | {"lease_expired": 12_345}
    monkeypatch.setattr(stuck, "survey", mock.Mock(return_value=([finding], counted)))
    monkeypatch.setattr(stuck, "count_stuck", mock.Mock(return_value=counted))
    code, out = run()
    assert code == 2 and str(job.pk) in out
    assert "[lease_expired]: 10,000+\n" in out and "... and 9,999+ more" in out
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 20_000}):
        assert "[lease_expired]: 12,345\n" in run("--counts")[1]
        code, out = run()
    assert "[lease_expired]: 12,345\n" in out and "... and 12,344 more" in out
    # JSON keeps plain numbers.
    assert json.loads(run("--json")[1])["counts"]["lease_expired"] == 10_000


def test_list_button_counts_stuck_jobs_up_to_a_cap(admin_client: Any, monkeypatch: Any) -> None:
    from jobstate.admin import jobs

    changelist = reverse("admin:jobstate_job_changelist")
    expired()
    assert "Stuck jobs (1)" in admin_client.get(changelist).content.decode()
    expired()
    expired()
    monkeypatch.setattr(jobs, "BADGE_CAP", 2)
    assert "Stuck jobs (2+)" in admin_client.get(changelist).content.decode()


def test_a_count_of_exactly_the_cap_has_no_plus(admin_client: Any, monkeypatch: Any) -> None:
    """A "+" means more than N: exactly N stuck jobs read "N" (they read "N+", counted
    only up to N), on the stuck page, the list's button, the dashboard and the command."""
    from jobstate.admin import dashboard, jobs

    monkeypatch.setattr(jobs, "BADGE_CAP", 2)
    monkeypatch.setattr(dashboard, "BADGE_CAP", 2)
    changelist = reverse("admin:jobstate_job_changelist")

    def looks() -> tuple[dict[str, Any], str, Any, str]:
        with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2}):
            groups = admin_client.get(STUCK).context["groups"]
            [group] = [g for g in groups if g["reason"].code == "lease_expired"]
            button = admin_client.get(changelist).content.decode()
            tiles = admin_client.get(reverse("admin:jobstate_job_dashboard")).context
            return group, button, tiles, run("--limit", "1", "--reason", "lease_expired")[1]

    expired()
    expired()
    failed(error="boom")
    group, button, tiles, out = looks()
    assert group["count_label"] == "2" and group["more"] == 0 and "Stuck jobs (2)" in button
    assert (tiles["stuck_active"], tiles["stuck_total"]) == (2, 3)
    assert not tiles["stuck_active_capped"] and not tiles["stuck_capped"]
    assert "[lease_expired]: 2\n" in out and "... and 1 more" in out
    # More recent failures than the cap say nothing of the active stuck jobs.
    failed(error="boom")
    failed(error="boom")
    group, button, tiles, out = looks()
    assert (tiles["stuck_active"], tiles["stuck_total"]) == (2, 4)
    assert not tiles["stuck_active_capped"] and tiles["stuck_capped"]
    expired()
    group, button, tiles, out = looks()
    assert group["count_label"] == "2+" and "Stuck jobs (2+)" in button
    assert tiles["stuck_active"] == 2 and tiles["stuck_active_capped"]
    assert "[lease_expired]: 2+\n" in out and "... and 1+ more" in out
    # JSON counts (no "+" there) stop at the cap, as the metrics gauge's do.
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2}):
        assert json.loads(run("--json")[1])["counts"]["lease_expired"] == 2


def test_a_reserved_job_its_cluster_keeps_is_not_flagged_no_heartbeat(admin_client: Any) -> None:
    """A cluster reserved a job 10 minutes ago and keeps renewing its lease while it
    waits behind a long job: healthy, for the job list and the remedy view as for the
    stuck page."""
    job = queued(run_after=ago(minutes=11))
    [claimed] = services.claim("cluster-a", limit=1, lease_seconds=60, now=ago(minutes=10))
    assert claimed.pk == job.pk and claimed.started_at is None
    services.extend_leases("cluster-a", [(claimed.pk, claimed.lease_token)])
    job.refresh_from_db()
    ctx = stuck.Context()
    assert [
        r.code for r in stuck.REASONS if Job.objects.filter(pk=job.pk).filter(r.query(ctx)).exists()
    ] == []
    assert stuck.check(job, ctx=ctx) is None
    html = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    assert str(job.pk)[-8:] in html and "no heartbeat" not in html


def test_cancelling_one_unserved_job_keeps_the_others_of_its_kind_reported(temp_handler: Any) -> None:
    """A job cancelled before it ever ran says nothing of a worker serving its kind."""
    temp_handler("test.orphan")
    a = queued(kind="test.orphan", run_after=ago(hours=1))
    b = queued(kind="test.orphan", run_after=ago(hours=1))
    assert {f.job.pk for f in stuck.find_stuck()} == {a.pk, b.pk}
    services.request_cancel(a, "ops", "stuck remedy")
    assert {f.job.pk: f.reason for f in stuck.find_stuck()} == {b.pk: "queued_no_worker"}


def test_queued_no_worker_is_found_beyond_the_first_200_kinds(temp_handler: Any) -> None:
    temp_handler("zz.orphan")
    for i in range(201):
        temp_handler(f"a.k{i:03d}")
        queued(kind=f"a.k{i:03d}", run_after=timezone.now() + timedelta(hours=1))
    late = queued(kind="zz.orphan", run_after=ago(hours=1))
    assert {f.job.pk: f.reason for f in stuck.find_stuck()} == {late.pk: "queued_no_worker"}


def test_a_queued_job_whose_handler_was_removed_from_the_code_says_so(
    admin_client: Any, temp_handler: Any
) -> None:
    """Its kind registered when it was enqueued, gone since (a handler, or a task, renamed
    or removed): no worker claims it; the stuck page, the command and the API say why."""
    temp_handler("test.orphan")  # registered, only no worker runs it
    idle = queued(kind="test.orphan", run_after=ago(hours=1))
    for kind in ("test.gone", "tests.tasks_app.tasks.renamed_away"):
        temp_handler(kind)
    gone = queued(kind="test.gone", run_after=ago(hours=1))
    task = queued(kind="tests.tasks_app.tasks.renamed_away", run_after=ago(hours=2), parameters={"args": []})
    registry.unregister("test.gone")
    registry.unregister("tests.tasks_app.tasks.renamed_away")
    texts = {f.job.pk: (f.reason, f.text) for f in stuck.find_stuck()}
    assert texts[idle.pk] == (
        "queued_no_worker",
        "Due 1\xa0hour ago and still queued: no worker has run a 'test.orphan' job recently.",
    )
    for job in (gone, task):
        reason, text = texts[job.pk]
        assert reason == "queued_no_worker"
        assert (
            f"no handler or task is registered as '{job.kind}' in this code (renamed or removed?), so no "
            "worker running it will claim the job. Cancel it, or deploy code that registers the kind again."
        ) in text
    section = admin_client.get(STUCK).content.decode().split('id="reason-queued_no_worker"', 1)[1]
    section = section.split("</section>", 1)[0]
    assert (
        f'data-job="{task.pk}"' in section
        and escape("'tests.tasks_app.tasks.renamed_away' in this code") in section
    )
    code, out = run("--reason", "queued_no_worker")
    assert (
        code == 2 and f"{gone.pk}  test.gone  Due 1\xa0hour ago and still queued: no handler or task" in out
    )
    api = {f["job"]: f["text"] for f in admin_client.get("/api/jobs/stuck/").json()}
    assert "no handler or task is registered as 'test.gone'" in api[str(gone.pk)]
    assert remedy(admin_client, task, "cancel").status_code == 302
    task.refresh_from_db()
    assert task.status == Status.CANCELLED


def test_the_stuck_page_and_the_dashboard_say_stuck_and_failed_alike_and_list_no_empty_reason(
    admin_client: Any,
) -> None:
    # The dashboard said "0 stuck (3 with recent failures)" and this page "3 jobs need
    # attention", each with a heading and a remedy for six reasons without a job.
    failed(error="boom")
    failed(error="boom")
    expired()
    html = " ".join(admin_client.get(STUCK).content.decode().split())
    assert "<strong>3</strong> jobs need attention: 1 stuck, 2 failed after their last attempt." in html
    assert 'id="reason-lease_expired"' in html and 'id="reason-recently_failed"' in html
    assert 'id="reason-no_heartbeat"' not in html and "Remedy: Requeue it: the worker looks hung" not in html
    assert "Nothing in: Cancel requested but not honoured; Running past" in html
    tiles = " ".join(admin_client.get(reverse("admin:jobstate_job_dashboard")).content.decode().split())
    assert "stuck, 2 failed after their last attempt</span>" in tiles


def test_the_stuck_pages_headline_adds_up_the_capped_counts_as_the_dashboards_tile(
    admin_client: Any, monkeypatch: Any
) -> None:
    # Each reason is counted one past the cap: the headline added those up and said
    # "4 jobs need attention: 3 stuck" beside the group's "2+", where the tile said "2+".
    from jobstate.admin import dashboard

    monkeypatch.setattr(dashboard, "BADGE_CAP", 2)
    for _ in range(3):
        expired()
    failed(error="boom")
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2}):
        html = " ".join(admin_client.get(STUCK).content.decode().split())
    assert "<strong>3+</strong> jobs need attention: 2+ stuck, 1 failed after its last attempt." in html
    tiles = " ".join(admin_client.get(reverse("admin:jobstate_job_dashboard")).content.decode().split())
    assert '"js-tile-n">2+</span><span class="js-tile-l">stuck, 1 failed after its last attempt' in tiles
    failed(error="boom")  # exactly the cap: no "+"
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2}):
        html = " ".join(admin_client.get(STUCK).content.decode().split())
    assert "<strong>4+</strong> jobs need attention: 2+ stuck, 2 failed after their last attempt." in html
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 2_000}):
        html = " ".join(admin_client.get(STUCK).content.decode().split())
    assert "<strong>5</strong> jobs need attention: 3 stuck, 2 failed after their last attempt." in html


def test_a_job_that_failed_under_a_minute_ago_says_so_in_seconds(admin_client: Any) -> None:
    # "Failed 0 minutes ago" stood beside "for 51s".
    job = failed(error="boom")
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(seconds=41))
    html = admin_client.get(STUCK).content.decode()
    assert "0 minutes" not in html
    assert "Failed 41 seconds ago after attempt 1/1" in html or "Failed 42 seconds ago" in html
    from jobstate.stuck.context import _ago

    now = timezone.now()
    assert _ago(now, now) == "just now" and _ago(now - timedelta(seconds=1), now) == "1 second ago"
    assert _ago(now - timedelta(minutes=2), now) == "2\xa0minutes ago"  # timesince's


def test_the_no_worker_remedy_says_where_workers_find_a_django_tasks_task() -> None:
    # A @task in a module no worker imports (not an app's tasks module) waits for ever: the
    # remedy only suggested the task was renamed or removed.
    text = stuck.BY_CODE[stuck.QUEUED_NO_WORKER].remedy_text
    assert "installed app's tasks module" in text and "OPTIONS['MODULES']" in text
