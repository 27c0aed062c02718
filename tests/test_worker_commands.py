"""manage.py jobstate_reap, jobstate_prune and jobstate_schedule."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone
from django_q.models import Schedule

from jobstate import services
from jobstate.exceptions import AlreadyRetried
from jobstate.models import Asset, Job, JobEvent
from jobstate.states import Status
from jobstate.worker import schedules
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db(transaction=True)


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def expire(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))


def test_reap_once_requeues_or_fails_lost_jobs():
    retried = services.enqueue("test.echo", {})
    (claimed,) = services.claim("lost:1")
    services.begin(claimed, claimed.lease_token, "lost:1:1")
    expire(claimed)
    last = services.enqueue("test.echo", {}, max_attempts=1)
    (claimed,) = services.claim("lost:2")
    services.begin(claimed, claimed.lease_token, "lost:2:1")
    expire(claimed)
    out = command("jobstate_reap")
    assert out.startswith("requeued 1, failed 1, cancelled 0")
    retried.refresh_from_db()
    last.refresh_from_db()
    assert retried.status == Status.QUEUED and last.status == Status.FAILED
    assert last.error_message == "worker lost"
    assert set(
        JobEvent.objects.filter(transition__in=["requeue", "fail"]).values_list("actor_label", flat=True)
    ) == {"system:reaper"}
    assert command("jobstate_reap").startswith("requeued 0, failed 0, cancelled 0")


@pytest.mark.parametrize(
    ("use_tz", "zone", "shown"), [(False, "Europe/Paris", "Europe/Paris"), (True, "Europe/Paris", "UTC")]
)
def test_prune_names_the_zone_of_its_cutoff(use_tz, zone, shown):
    # With USE_TZ = False the cutoff is naive, in TIME_ZONE: "%Z" printed nothing ("18:37:15 ;").
    with override_settings(USE_TZ=use_tz, TIME_ZONE=zone):
        out = command("jobstate_prune", "--days", "3")
    assert re.search(rf"finished before \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d {shown}; ", out), out


def test_reap_help_names_the_cancelled_jobs_it_reports():
    # It spoke of requeueing or failing only, while the run below reports "cancelled 1".
    from django.core.management import load_command_class

    assert "cancel them (a cancel was requested)" in load_command_class("jobstate", "jobstate_reap").help
    job = services.enqueue("test.echo", {})
    (claimed,) = services.claim("lost:1")
    services.begin(claimed, claimed.lease_token, "lost:1:1")
    services.request_cancel(job, "ops")
    expire(claimed)
    assert command("jobstate_reap").startswith("requeued 0, failed 0, cancelled 1")


def test_reap_exits_non_zero_when_a_job_could_not_be_reaped(monkeypatch):
    from jobstate.services import reaper

    lost = services.enqueue("test.echo", {})
    (claimed,) = services.claim("lost:1")
    services.begin(claimed, claimed.lease_token, "lost:1:1")
    expire(claimed)

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a hook failed")

    monkeypatch.setattr(reaper, "move", broken)
    out = StringIO()
    with pytest.raises(CommandError, match="1 expired job"):
        call_command("jobstate_reap", stdout=out)
    assert f"not reaped (an error, logged) {lost.pk}" in out.getvalue()
    assert Job.objects.get(pk=lost.pk).status == Status.PROCESSING


def lost_jobs(count: int) -> list[Job]:
    jobs = []
    for n in range(count):
        job = services.enqueue("test.echo", {})
        (claimed,) = services.claim(f"lost:{n}")
        services.begin(claimed, claimed.lease_token, f"lost:{n}:1")
        Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=10 - n))
        jobs.append(job)
    return jobs


def test_reap_says_when_expired_jobs_remain_past_its_limit():
    # It reaped its limit and said nothing of the jobs it never looked at: the
    # operator took "requeued 2" for the whole of it.
    jobs = lost_jobs(3)
    out = command("jobstate_reap", "--limit", "2")
    assert out.startswith("requeued 2, failed 0, cancelled 0")
    assert "more expired jobs remain: this run stopped at its limit (2, --limit); run it again" in out
    assert Job.objects.get(pk=jobs[2].pk).status == Status.PROCESSING  # the newest expiry: next time
    out = command("jobstate_reap", "--limit", "2")
    assert out.startswith("requeued 1,") and "remain" not in out
    assert not Job.objects.filter(status=Status.PROCESSING).exists()


def test_reap_at_exactly_its_limit_says_nothing_remains():
    lost_jobs(2)
    report = services.requeue_expired(limit=2)
    assert len(report.requeued) == 2 and not report.more
    assert "remain" not in command("jobstate_reap", "--limit", "2")


@pytest.mark.parametrize("limit", ["0", "-1", "100001"])
def test_reap_refuses_a_limit_out_of_range(limit):
    lost = lost_jobs(1)[0]
    with pytest.raises(CommandError, match="--limit must be between 1 and 100000"):
        call_command("jobstate_reap", "--limit", limit, stdout=StringIO())
    assert Job.objects.get(pk=lost.pk).status == Status.PROCESSING


def finished(kind: str = "test.echo", days_ago: float = 40, **options) -> Job:  # type: ignore[no-untyped-def]
    job = services.enqueue(kind, {}, **options)
    drain(kinds=[kind])
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days_ago))
    return Job.objects.get(pk=job.pk)


def test_prune_deletes_old_finished_jobs_with_history_assets_and_files(temp_handler, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path

    def with_file(ctx):
        ctx.add_asset("report", b"a,b\n", name="r.csv")

    temp_handler("t.file", with_file)
    old = finished("t.file")
    stored = Path(tmp_path) / old.assets.get().file.name
    recent = finished("t.file", days_ago=1)
    running = services.enqueue("test.echo", {})
    assert stored.exists()

    dry = command("jobstate_prune", "--dry-run")
    assert dry.startswith("would delete 1 job(s), 3 event(s), 1 asset(s)")
    assert Job.objects.filter(pk=old.pk).exists() and stored.exists()

    out = command("jobstate_prune")
    assert out.startswith("deleted 1 job(s), 3 event(s), 1 asset(s)")
    assert not Job.objects.filter(pk=old.pk).exists() and not stored.exists()
    assert not Asset.objects.filter(job_id=old.pk).exists()
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, running.pk}

    assert command("jobstate_prune", "--days", "0.5").startswith("deleted 1 job(s)")
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]


def test_a_storage_that_fails_to_delete_a_file_does_not_stop_the_prune(
    temp_handler, settings, tmp_path, caplog
):
    # The error escaped the batch's commit: later files, batches and the orphan sweep never ran.
    from django.core.files.storage import FileSystemStorage

    settings.MEDIA_ROOT = tmp_path
    temp_handler("t.file", lambda ctx: ctx.add_asset("report", b"a,b\n", name="r.csv"))
    olds = [finished("t.file") for _ in range(3)]
    names = [job.assets.get().file.name for job in olds]
    real_delete = FileSystemStorage.delete

    def flaky_delete(self, name):  # type: ignore[no-untyped-def]
        if name == names[0]:
            raise OSError("storage unavailable")
        real_delete(self, name)

    settings.JOBSTATE = {"PRUNE_BATCH": 2}
    with mock.patch.object(FileSystemStorage, "delete", flaky_delete):
        out = command("jobstate_prune")
    assert out.startswith("deleted 3 job(s), 9 event(s), 3 asset(s)")
    assert [(Path(tmp_path) / name).exists() for name in names] == [True, False, False]
    assert "storage unavailable" in caplog.text
    os.utime(Path(tmp_path, names[0]), (0, 0))  # the leftover file, an hour old: the sweep's
    assert command("jobstate_prune").startswith("deleted 0 job(s)")
    assert not (Path(tmp_path) / names[0]).exists()


def test_prune_works_in_batches_and_keeps_jobs_tied_to_active_work(temp_handler):
    temp_handler("t.idle")  # never run here: its jobs stay active
    olds = [finished() for _ in range(5)]
    parent = services.enqueue("t.idle", {})
    child_of_active = finished(parent=parent)
    busy_parent = finished()
    services.enqueue("t.idle", {}, parent=busy_parent)
    out = command("jobstate_prune", "--batch", "2")
    assert out.startswith("deleted 5 job(s)")
    assert not Job.objects.filter(pk__in=[j.pk for j in olds]).exists()
    assert Job.objects.filter(pk__in=[child_of_active.pk, busy_parent.pk]).count() == 2


def test_prune_keeps_every_ancestor_of_an_active_job(temp_handler):
    # Deleting a job deletes its children: a finished grandparent whose finished
    # child has an active child would take that active job with it.
    temp_handler("t.idle")
    grandparent = finished()
    parent = finished(parent=grandparent)
    active = services.enqueue("t.idle", {}, parent=parent)
    lone = finished()
    assert command("jobstate_prune").startswith("deleted 1 job(s)")
    assert not Job.objects.filter(pk=lone.pk).exists()
    assert Job.objects.filter(pk__in=[grandparent.pk, parent.pk, active.pk]).count() == 3


def test_prune_keeps_a_recent_child_of_an_old_parent_and_counts_what_it_deletes(temp_handler):
    # A child retried today keeps its old parent (services.retry): deleting the
    # parent cascaded to it, a job finished minutes ago; --dry-run counted 1, the
    # run deleted 2.
    temp_handler("t.boom", lambda ctx: 1 / 0)
    parent = services.enqueue("test.echo", {})
    child = services.enqueue("t.boom", {}, parent=parent, max_attempts=1)
    drain(kinds=["t.boom"])
    drain(kinds=["test.echo"])
    Job.objects.filter(pk=child.pk).update(finished_at=timezone.now() - timedelta(days=41))
    Job.objects.filter(pk=parent.pk).update(finished_at=timezone.now() - timedelta(days=40))
    temp_handler("t.boom", lambda ctx: None)
    again = services.retry(child.pk, reason="fixed")
    assert again.parent_id == parent.pk
    drain(kinds=["t.boom"])
    # An old family wholly past retention goes, parents after their children.
    top = finished()
    middle = finished(parent=top)
    finished(parent=middle, days_ago=50)
    dry = command("jobstate_prune", "--dry-run")
    assert dry.startswith("would delete 4 job(s)"), dry  # the old child and the family of 3
    assert command("jobstate_prune", "--batch", "1").startswith("deleted 4 job(s)")
    assert set(Job.objects.values_list("pk", flat=True)) == {parent.pk, again.pk}


def test_prune_keeps_a_finished_job_while_its_retry_is_active(temp_handler):
    # Deleting it set the active retry's retry_of to NULL: the admin and API no
    # longer showed what it retried, and "a job is retried once" lost its anchor.
    temp_handler("t.boom", lambda ctx: 1 / 0)
    old = services.enqueue("t.boom", {}, max_attempts=1)
    # In a workflow too: the retry keeps the old child's parent, and so that parent.
    top = services.enqueue("test.echo", {})
    child = services.enqueue("t.boom", {}, parent=top, max_attempts=1)
    drain(kinds=["t.boom"])
    drain(kinds=["test.echo"])
    Job.objects.filter(pk__in=[old.pk, top.pk, child.pk]).update(
        finished_at=timezone.now() - timedelta(days=40)
    )
    again = services.retry(old.pk, reason="fixed")  # queued, not run here: active
    child_again = services.retry(child.pk)
    hub = finished()  # kept above a job with an active retry outside the workflow
    spoke = finished(parent=hub)
    outside = services.enqueue("t.boom", {}, retry_of=spoke)
    lone = finished()
    assert command("jobstate_prune", "--dry-run").startswith("would delete 1 job(s)")
    assert command("jobstate_prune", "--batch", "1").startswith("deleted 1 job(s)")
    assert not Job.objects.filter(pk=lone.pk).exists()
    assert Job.objects.get(pk=again.pk).retry_of_id == old.pk
    assert Job.objects.get(pk=child_again.pk).retry_of_id == child.pk
    with pytest.raises(AlreadyRetried):
        services.retry(old.pk)
    temp_handler("t.boom")
    drain(kinds=["t.boom"])  # the retries end: the old jobs go at the next sweep
    assert command("jobstate_prune").startswith("deleted 4 job(s)")  # old, child, spoke, then hub
    assert set(Job.objects.values_list("pk", flat=True)) == {again.pk, top.pk, child_again.pk, outside.pk}
    assert Job.objects.get(pk=again.pk).retry_of_id is None


@pytest.mark.parametrize("days", [1_000_000, float("inf")])
def test_the_scheduled_prune_takes_any_retention_the_command_takes(settings, days):
    # timedelta(days=...) overflowed in the daily task (the only prune in production).
    from jobstate.worker import tasks

    settings.JOBSTATE = {"RETENTION_DAYS": days}
    finished()
    assert command("jobstate_prune").startswith("deleted 0 job(s)")
    assert tasks.prune()["jobs"] == 0


def test_prune_leaves_no_empty_directory_of_a_deleted_job(temp_handler, settings, tmp_path):
    # Every later clean-up listed each of them again, for ever.
    settings.MEDIA_ROOT = tmp_path
    temp_handler("t.file", lambda ctx: ctx.add_asset("report", b"a,b\n", name="r.csv"))
    job = finished("t.file")
    kept = finished("t.file", days_ago=1)
    folder = Path(tmp_path) / "jobstate" / str(job.pk)
    assert folder.is_dir()
    assert command("jobstate_prune").startswith("deleted 1 job(s)")
    assert not folder.exists()
    assert (Path(tmp_path) / "jobstate" / str(kept.pk)).is_dir()


def test_a_child_committed_under_a_parent_being_pruned_is_never_deleted_with_it(monkeypatch):
    # PostgreSQL reads each statement afresh: a child committed between the batch's
    # read and its delete was collected and deleted with its parent, unseen.
    import threading

    from django.db import connection

    from jobstate.worker import retention

    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL")
    parent = finished()
    made: dict[str, object] = {}

    def add_child() -> None:
        try:
            made["job"] = Job.objects.create(kind="test.echo", parent_id=parent.pk)
        except Exception as exc:  # waited for the prune, then refused: nothing lost
            made["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=add_child)

    def read_then_race(rows):  # type: ignore[no-untyped-def]
        rows = list(rows)
        if parent.pk in rows and not thread.is_alive() and not made:
            thread.start()
            thread.join(timeout=3)  # committed meanwhile, unless it must wait for the batch
        return rows

    monkeypatch.setattr(retention, "list", read_then_race, raising=False)
    command("jobstate_prune")
    thread.join(timeout=10)
    if "job" in made:
        assert Job.objects.filter(pk=made["job"].pk).exists(), "deleted with its parent"
    else:
        assert "error" in made and not Job.objects.filter(pk=parent.pk).exists()


def test_a_retry_committed_under_a_job_being_pruned_keeps_it(temp_handler, monkeypatch):
    # As for a child: a retry committed between the batch's read and its delete
    # lost its retry_of with the job.
    import threading

    from django.db import connection

    from jobstate.worker import retention

    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL")
    temp_handler("t.idle")
    old = finished("t.idle")
    made: dict[str, object] = {}

    def add_retry() -> None:
        try:
            made["job"] = services.retry(old.pk)
        except Exception as exc:  # waited for the prune, then refused: nothing lost
            made["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=add_retry)

    def read_then_race(rows):  # type: ignore[no-untyped-def]
        rows = list(rows)
        if old.pk in rows and not thread.is_alive() and not made:
            thread.start()
            thread.join(timeout=3)
        return rows

    monkeypatch.setattr(retention, "list", read_then_race, raising=False)
    command("jobstate_prune")
    thread.join(timeout=10)
    if "job" in made:
        assert Job.objects.get(pk=made["job"].pk).retry_of_id == old.pk, "unlinked from the job it retries"
    else:
        assert isinstance(made["error"], Job.DoesNotExist) and not Job.objects.filter(pk=old.pk).exists()


@override_settings(JOBSTATE={"RETENTION_DAYS": None})
def test_prune_keeps_everything_without_retention():
    finished()
    assert "nothing to do" in command("jobstate_prune")
    assert Job.objects.count() == 1


def test_prune_rejects_bad_arguments():
    with pytest.raises(CommandError):
        call_command("jobstate_prune", "--days", "-1")
    with pytest.raises(CommandError):
        call_command("jobstate_prune", "--batch", "0")


@override_settings(JOBSTATE={"RETENTION_DAYS": None})
def test_prune_rejects_a_bad_batch_without_retention_too():
    # It said "nothing to do" and exited 0: the typo showed only once retention was set.
    with pytest.raises(CommandError, match="--batch must be between 1 and 100000"):
        command("jobstate_prune", "--batch", "0")


def test_a_prune_batch_below_one_is_refused_not_repeated_for_ever(settings):
    # A batch of 0 found nothing, and the deliveries' loop asked again, for ever.
    import threading

    from django.db import connection

    from jobstate.worker.retention import prune

    settings.JOBSTATE = {"PRUNE_BATCH": 0}
    raised: list[str] = []

    def run() -> None:
        try:
            prune()
        except ValueError as exc:
            raised.append(str(exc))
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert raised == ["batch must be 1 or more"]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("batch", [0, -1])
def test_prune_refuses_a_batch_below_one_dry_run_or_not(dry_run, batch):
    # The dry run did not look at it, and a batch of 0 was read as PRUNE_BATCH.
    from jobstate.worker.retention import prune

    with pytest.raises(ValueError, match="batch must be 1 or more"):
        prune(30, dry_run=dry_run, batch=batch)


def test_schedule_installs_updates_and_removes():
    out = command("jobstate_schedule")
    assert f"created: {schedules.REAPER}" in out and f"created: {schedules.PRUNE}" in out
    reaper = Schedule.objects.get(name=schedules.REAPER)
    assert (reaper.func, reaper.schedule_type, reaper.minutes, reaper.repeats) == (
        "jobstate.worker.tasks.reap",
        Schedule.MINUTES,
        1,
        -1,
    )
    prune = Schedule.objects.get(name=schedules.PRUNE)
    assert (prune.func, prune.schedule_type) == ("jobstate.worker.tasks.prune", Schedule.DAILY)

    assert f"unchanged: {schedules.REAPER}" in command("jobstate_schedule")
    later = timezone.now() + timedelta(minutes=30)
    Schedule.objects.filter(name=schedules.REAPER).update(minutes=30, next_run=later)
    assert f"updated: {schedules.REAPER}" in command("jobstate_schedule")
    reaper = Schedule.objects.get(name=schedules.REAPER)
    # The new cadence starts now, not at the stale row's next run.
    assert reaper.minutes == 1 and reaper.next_run <= timezone.now()
    # A row with no next run (written by other code) never ran: it gets one.
    Schedule.objects.filter(name=schedules.REAPER).update(minutes=5, next_run=None)
    assert f"updated: {schedules.REAPER}" in command("jobstate_schedule")
    assert Schedule.objects.get(name=schedules.REAPER).next_run is not None
    # A change that keeps the cadence keeps the next run (a cluster is kept: test_schedule_cluster).
    Schedule.objects.filter(name=schedules.REAPER).update(args="(1,)", next_run=later)
    assert f"updated: {schedules.REAPER}" in command("jobstate_schedule")
    assert Schedule.objects.get(name=schedules.REAPER).next_run == later
    assert Schedule.objects.count() == 2

    assert f"removed: {schedules.PRUNE}" in command("jobstate_schedule", "--no-prune")
    assert list(Schedule.objects.values_list("name", flat=True)) == [schedules.REAPER]
    assert "removed 1 schedule(s)" in command("jobstate_schedule", "--remove")
    assert not Schedule.objects.exists()


def test_schedule_says_why_it_leaves_pruning_out_without_retention(settings):
    # It printed only the reaper's line (or "removed: ..." for an older prune schedule).
    command("jobstate_schedule")
    settings.JOBSTATE = {"RETENTION_DAYS": None}
    out = command("jobstate_schedule")
    assert f"removed: {schedules.PRUNE}" in out
    assert f"not scheduled: {schedules.PRUNE} (RETENTION_DAYS is None: finished jobs are kept)" in out
    assert "not scheduled" not in command("jobstate_schedule", "--no-prune")
    assert list(Schedule.objects.values_list("name", flat=True)) == [schedules.REAPER]


def test_schedule_refuses_remove_with_no_prune():
    # --remove won silently: an operator who meant "the reaper only" lost it too.
    command("jobstate_schedule")
    with pytest.raises(CommandError, match="not allowed with argument"):
        command("jobstate_schedule", "--remove", "--no-prune")
    assert Schedule.objects.count() == 2


def test_prune_days_0_keeps_jobs_the_metrics_have_not_counted_yet(settings):
    # --days 0 deleted a job finished a second ago, with its history rows, before the
    # metrics fold (which waits METRICS_SETTLE_SECONDS) counted them: lost from the counters.
    settings.JOBSTATE = {"METRICS_SETTLE_SECONDS": 60}
    unsettled = finished(days_ago=30 / 86_400)
    settled = finished(days_ago=90 / 86_400)
    assert command("jobstate_prune", "--days", "0", "--dry-run").startswith("would delete 1 job(s)")
    assert command("jobstate_prune", "--days", "0").startswith("deleted 1 job(s)")
    assert list(Job.objects.values_list("pk", flat=True)) == [unsettled.pk]
    assert not Job.objects.filter(pk=settled.pk).exists()


def test_prune_takes_a_long_retention_from_the_settings(settings):
    # --days is bounded; a setting past the bound deletes what the bound would (nothing).
    settings.JOBSTATE = {"RETENTION_DAYS": 73_000}
    old = finished()
    assert command("jobstate_prune").startswith("deleted 0 job(s)")
    assert Job.objects.filter(pk=old.pk).exists()


def test_a_batch_held_by_another_transaction_ends_the_prune_instead_of_spinning():
    # Reading again found the same held jobs at once, for as long as they were held.
    import threading
    import time

    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("row locks of another connection: PostgreSQL")
    held = finished()
    settings = connection.settings_dict
    dsn = (
        f"host={settings['HOST']} port={settings['PORT'] or 5432}"
        f" user={settings['USER']} dbname={settings['NAME']}"
    )
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1 FROM jobstate_job WHERE id = %s FOR UPDATE", [held.pk])
        timer = threading.Timer(5, other.rollback)  # the old loop spun until then
        timer.start()
        started = time.monotonic()
        out = command("jobstate_prune")
        elapsed = time.monotonic() - started
        timer.cancel()
        other.rollback()
    assert out.startswith("deleted 0 job(s)") and elapsed < 3, (out, elapsed)
    assert Job.objects.filter(pk=held.pk).exists()


def test_prune_reports_the_webhook_deliveries_it_deletes(user):
    from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id="msg_old",
        event="job.completed",
        job_id="8d6f3c52-4f0c-4b8e-9d0a-0c3f1f0a1b2c",
        created_at=timezone.now() - timedelta(days=400),
    )
    dry = command("jobstate_prune", "--days", "30", "--dry-run")
    assert WebhookDelivery.objects.count() == 1
    assert "; 1 webhook delivery record(s) older than that;" in dry, dry
    out = command("jobstate_prune", "--days", "30")
    assert WebhookDelivery.objects.count() == 0
    assert "; 1 webhook delivery record(s) older than that;" in out, out


def test_two_schedule_installs_at_once_create_one_reaper_schedule(monkeypatch):
    # Both read "no reaper schedule" and both created one: the reaper ran twice a minute.
    import threading

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL (SQLite's IMMEDIATE transactions queue)")
    create = Schedule.objects.create
    other = threading.Thread(target=lambda: (schedules.install(prune=False), connection.close()))

    def create_after_the_other(**fields: object) -> Schedule:
        if not other.is_alive() and threading.current_thread() is threading.main_thread():
            other.start()
            other.join(timeout=3)  # it installed meanwhile, unless it waits for this one
        return create(**fields)

    monkeypatch.setattr(Schedule.objects, "create", create_after_the_other)
    schedules.install(prune=False)
    other.join(timeout=10)
    assert Schedule.objects.filter(name=schedules.REAPER).count() == 1
