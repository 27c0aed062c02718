"""Pausing a kind (``services.pause_kind``): no claim takes its queued jobs until it
is resumed; enqueue goes on; refusals write nothing."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate import hooks, services, testing
from jobstate.exceptions import KindPaused, LeaseLost, PauseRefused, UnknownKind
from jobstate.models import Job, KindPause
from jobstate.states import Status
from jobstate.worker import runner, tasks
from jobstate.worker.cluster import cluster_id
from jobstate.worker.retention import prune

pytestmark = pytest.mark.django_db

ME = "host:1:2"


def _claimed_kinds(jobs: list[Job]) -> list[str]:
    return sorted(job.kind for job in jobs)


@pytest.fixture
def other_kind(temp_handler):  # type: ignore[no-untyped-def]
    temp_handler("test.other")
    return "test.other"


@pytest.mark.parametrize("start", [False, True])
def test_a_claim_skips_a_paused_kind_and_takes_it_again_once_resumed(start, other_kind):
    paused = [services.enqueue("test.echo", {"n": n}, priority=5) for n in range(3)]
    other = services.enqueue(other_kind, {})
    services.pause_kind("test.echo", "ops", "mail API down")
    # Ahead in claim order, yet left queued: the batch takes the other kind only.
    assert [j.pk for j in services.claim(ME, limit=10, start=start)] == [other.pk]
    assert services.claim(ME, kinds=["test.echo"], limit=10, start=start) == []
    assert set(Job.objects.filter(pk__in=[j.pk for j in paused]).values_list("status", flat=True)) == {
        Status.QUEUED
    }
    services.resume_kind("test.echo", "ops")
    assert _claimed_kinds(services.claim(ME, limit=10, start=start)) == ["test.echo"] * 3


def test_a_claim_with_a_concurrency_limit_skips_a_paused_kind(other_kind):
    # Limits are counted in a claim of their own (_within_limits): it leaves paused kinds out too.
    limited = [services.enqueue("test.limited", {}, priority=5) for _ in range(2)]
    other = services.enqueue(other_kind, {})
    services.pause_kind("test.limited", "ops")
    assert [j.pk for j in services.claim(ME, limit=10)] == [other.pk]
    assert services.claim(ME, kinds=["test.limited"], limit=10, start=True) == []
    services.resume_kind("test.limited", "ops")
    assert sorted(j.pk for j in services.claim(ME, limit=10)) == sorted(j.pk for j in limited)


def test_enqueue_goes_on_while_paused_and_running_jobs_finish():
    running = services.enqueue("test.echo", {})
    (held,) = services.claim(ME, start=True)
    services.pause_kind("test.echo", "ops")
    queued = services.enqueue("test.echo", {"later": True})
    assert queued.status == Status.QUEUED
    done = services.complete(held, held.lease_token, {"ok": 1})
    assert done.pk == running.pk and done.status == Status.COMPLETED
    assert services.claim(ME) == []


def test_drain_leaves_a_paused_kind_queued():
    job = services.enqueue("test.echo", {})
    services.pause_kind("test.echo", "ops")
    assert testing.drain() == 0
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    services.resume_kind("test.echo", "ops")
    assert testing.drain() == 1


def test_start_of_a_job_of_a_paused_kind_is_refused_and_the_id_only_path_skips_it(broker):
    job = services.enqueue("test.echo", {})
    services.pause_kind("test.echo", "ops")
    with pytest.raises(KindPaused, match=r"'test\.echo' is paused"):
        services.start(job, ME)
    assert tasks.run_by_id(job.pk) == "skipped"
    row = Job.objects.get(pk=job.pk)
    assert row.status == Status.QUEUED and row.attempts == 0 and testing.transitions(row) == ["enqueue"]


@pytest.mark.parametrize("path", ["run_job", "execute"])
def test_a_job_reserved_before_the_pause_is_handed_back_not_begun(
    broker, temp_handler, caplog, path, other_kind
):  # type: ignore[no-untyped-def]
    # A cluster reserved it (waiting in django-q2's queue for a free worker process)
    # before the pause: begin started it anyway, up to PREFETCH of them, minutes later.
    ran: list[str] = []
    temp_handler("t.paused", lambda ctx: ran.append(ctx.job.kind))
    temp_handler(other_kind, lambda ctx: ran.append(ctx.job.kind))
    job = services.enqueue("t.paused", {})
    cluster = cluster_id()
    (claimed,) = services.claim(cluster, kinds=["t.paused"])
    other = services.enqueue(other_kind, {})
    services.pause_kind("t.paused", "ops", "mail API down")
    told: list[str] = []

    def started(ctx: object) -> None:
        told.append("started")

    def ended(ctx: object, outcome: str) -> None:
        told.append(outcome)

    hooks.attempt_started.register(started)
    hooks.attempt_ended.register(ended)
    caplog.set_level(logging.INFO, logger="jobstate")
    try:
        if path == "run_job":
            outcome = runner.run_job(claimed, "host:1:2")
        else:
            outcome = tasks.execute(str(job.pk), str(claimed.lease_token), "t.paused")
        # Told of the other kind's attempt only (the chain's), none of the paused one.
        assert told == ([] if path == "run_job" else ["started", "completed"])
    finally:
        hooks.attempt_started.unregister(started)
        hooks.attempt_ended.unregister(ended)
    # Never begun, no attempt charged, ready at once (the claim leaves it queued).
    assert outcome == "paused"
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.started_at, row.lease_token, row.worker_id) == (
        Status.QUEUED,
        0,
        None,
        None,
        "",
    )
    assert row.run_after <= timezone.now()
    assert testing.transitions(row) == ["enqueue", "claim", "requeue"]
    requeue = row.events.order_by("id").last()
    assert requeue.actor_label.startswith("worker:") and requeue.actor_label.endswith(
        "host:1:2" if path == "run_job" else f"{cluster}:{os.getpid()}"
    )
    assert requeue.reason.startswith("kind 't.paused' paused before it started")
    assert requeue.metadata == {"handed_back": True}  # a refund: no attempt counted from the history
    said = [r.getMessage() for r in caplog.records if str(job.pk) in r.getMessage()]
    assert said == [
        f"Job {job.pk} not started: kind 't.paused' was paused; handed back to the queue, no attempt charged"
    ]
    # The worker process went on with other work (its chain), not the paused kind.
    assert ran == ([other_kind] if path == "execute" else [])
    assert Job.objects.get(pk=other.pk).status == (Status.COMPLETED if path == "execute" else Status.QUEUED)
    assert services.claim(cluster, kinds=["t.paused"]) == []
    services.resume_kind("t.paused", "ops")
    assert testing.drain(kinds=["t.paused"]) == 1
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1) and ran[-1] == "t.paused"


@pytest.mark.parametrize("returning", [True, False])
def test_begin_refuses_a_paused_kind_as_start_does_in_the_same_update(monkeypatch, returning):
    services.enqueue("test.echo", {})
    (claimed,) = services.claim(ME)
    services.pause_kind("test.echo", "ops")
    if not returning:  # a database without UPDATE ... RETURNING: the ORM's UPDATE
        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    with pytest.raises(KindPaused, match=r"'test\.echo' is paused"):
        services.begin(claimed, claimed.lease_token, "host:1:2")
    assert Job.objects.get(pk=claimed.pk).status == Status.QUEUED
    with pytest.raises(LeaseLost):  # handed back: the token holds nothing now
        services.begin(claimed, claimed.lease_token, "host:1:2")


def test_begin_of_a_kind_not_paused_is_one_statement(other_kind):
    services.enqueue("test.echo", {})
    services.enqueue(other_kind, {})
    services.pause_kind(other_kind, "ops")  # another kind's pause changes nothing
    (claimed,) = services.claim(ME, kinds=["test.echo"])
    with CaptureQueriesContext(connection) as queries:
        begun = services.begin(claimed, claimed.lease_token, "host:1:2")
    expected = 1 if connection.features.can_return_columns_from_insert else 2  # UPDATE, then the row
    assert len(queries) == expected and begun.attempt == 1 and begun.job.started_at is not None
    assert "NOT EXISTS" in queries[0]["sql"] and KindPause._meta.db_table in queries[0]["sql"]


def test_pause_and_resume_keep_who_when_and_why(user):
    pause = services.pause_kind("test.echo", services.Actor.admin(user), "mail API down")
    assert pause.active and pause.paused_by == user and pause.paused_by_label == "admin"
    assert pause.paused_by_text == "admin (alice)" and pause.reason == "mail API down"
    assert [p.kind for p in services.paused_kinds()] == ["test.echo"]
    ended = services.resume_kind("test.echo", "cli:bob", "back up")
    assert ended.pk == pause.pk and not ended.active and ended.resumed_at is not None
    assert (ended.resumed_by, ended.resumed_by_label, ended.resume_reason) == (None, "cli:bob", "back up")
    assert services.paused_kinds() == []
    # Paused again: a new row; the old one stays as the record.
    services.pause_kind("test.echo", "ops", "again")
    assert KindPause.objects.filter(kind="test.echo").count() == 2


def test_a_double_pause_and_a_resume_of_a_kind_not_paused_are_refused_writing_nothing():
    with pytest.raises(PauseRefused, match=r"'test\.echo' is not paused"):
        services.resume_kind("test.echo", "ops")
    assert not KindPause.objects.exists()
    first = services.pause_kind("test.echo", "ops", "incident")
    with pytest.raises(PauseRefused, match=r"'test.echo' is already paused \(by ops since .*: incident\)"):
        services.pause_kind("test.echo", "someone else", "me too")
    assert list(KindPause.objects.values_list("pk", "reason")) == [(first.pk, "incident")]
    services.resume_kind("test.echo", "ops")
    with pytest.raises(PauseRefused, match="not paused"):
        services.resume_kind("test.echo", "ops")
    assert KindPause.objects.get().resumed_by_label == "ops"


def test_an_unknown_kind_is_refused_unless_jobs_of_it_are_stored():
    with pytest.raises(UnknownKind):
        services.pause_kind("test.ecoh", "ops")  # a typo pauses nothing
    assert not KindPause.objects.exists()
    # A kind only another deploy's workers register: its jobs are in the table.
    Job.objects.create(kind="elsewhere.only", parameters={})
    services.pause_kind("elsewhere.only", "ops")
    assert services.claim(ME, limit=10) == []
    services.resume_kind("elsewhere.only", "ops")


def test_the_database_holds_one_active_pause_per_kind():
    KindPause.objects.create(kind="test.echo", paused_by_label="ops")
    with pytest.raises(IntegrityError), transaction.atomic():
        KindPause.objects.create(kind="test.echo", paused_by_label="bypass")
    # Ended pauses are not counted.
    KindPause.objects.filter(kind="test.echo").update(resumed_at=timezone.now())
    KindPause.objects.create(kind="test.echo", paused_by_label="again")
    KindPause.objects.create(kind="test.limited", paused_by_label="other kind")


def test_a_pause_that_loses_the_race_is_refused_as_already_paused(monkeypatch):
    # Another pause commits between the check and the insert: the constraint refuses
    # it and the caller gets the same refusal, not an IntegrityError.
    from jobstate.services import pauses

    real = pauses.active_pause
    calls = []

    def racing(kind: str) -> KindPause | None:
        calls.append(kind)
        if len(calls) == 1:
            KindPause.objects.create(kind=kind, paused_by_label="other operator", reason="first")
            return None
        return real(kind)

    monkeypatch.setattr(pauses, "active_pause", racing)
    with pytest.raises(PauseRefused, match=r"already paused \(by other operator since .*: first\)"):
        services.pause_kind("test.echo", "ops")
    assert not KindPause.objects.exists()  # (the stand-in for the other pause was in the same transaction)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="two connections at once")
@pytest.mark.django_db(transaction=True)
def test_two_pauses_at_once_one_is_refused_readably():
    import threading

    from django.db import connections

    inserted, go_on = threading.Event(), threading.Event()

    def other_operator() -> None:
        try:
            with transaction.atomic():
                KindPause.objects.create(kind="test.echo", paused_by_label="other operator")
                inserted.set()
                go_on.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_operator)
    thread.start()
    assert inserted.wait(10)
    timer = threading.Timer(0.3, go_on.set)  # commits while our insert waits on its entry
    timer.start()
    try:
        with pytest.raises(PauseRefused, match=r"already paused \(by other operator since"):
            services.pause_kind("test.echo", "ops")
    finally:
        go_on.set()
        thread.join()
    assert list(KindPause.objects.values_list("paused_by_label", flat=True)) == ["other operator"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan")
def test_the_claim_still_reads_the_queued_index_and_locks_job_rows_only():
    from jobstate.services.claiming import ready_sql

    services.pause_kind("test.echo", "ops")
    # A queue of several kinds big enough for the plan a real one gets. (Paused kinds
    # as a `kind <> ALL(...)` were estimated to leave 1 row: a scan and sort of it all.)
    Job.objects.bulk_create([Job(kind=f"k{i % 5}", parameters={}) for i in range(3000)])
    sql, params = ready_sql(None, 10, timezone.now(), True)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobstate_job_claim_idx" in plan, plan
    # An anti-join beside the index scan, in its order (no sort), and FOR UPDATE
    # locks the rows of the job table only.
    assert "Anti Join" in plan and "Sort" not in plan and "Seq Scan" not in plan, plan
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.execute(
            "SELECT relation::regclass::text FROM pg_locks WHERE pid = pg_backend_pid() "
            "AND mode = 'RowShareLock' AND relation IN (%s::regclass, %s::regclass)",
            [KindPause._meta.db_table, Job._meta.db_table],
        )
        assert [row[0] for row in cursor.fetchall()] == [Job._meta.db_table]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the hand-over is one statement on PostgreSQL")
def test_a_workers_hand_over_to_its_next_job_skips_a_paused_kind():
    services.enqueue("test.echo", {"n": 0})
    (done,) = services.claim(ME, kinds=["test.echo"], start=True)
    following = services.enqueue("test.echo", {"n": 1})
    services.pause_kind("test.echo", "ops")
    then = services.NextClaim(ME, ["test.echo"])
    services.complete(done, done.lease_token, None, then=then)
    assert then.tried and then.claimed == []
    assert Job.objects.get(pk=following.pk).status == Status.QUEUED


def test_a_paused_kinds_queued_jobs_are_their_own_stuck_finding_with_resume_as_remedy():
    from io import StringIO

    from django.core.management import call_command

    from jobstate import stuck
    from tests.admin_support import ago, queued

    job = queued(run_after=ago(hours=1))  # no worker ran a test.echo job lately
    assert {f.job.pk: f.reason for f in stuck.find_stuck()} == {job.pk: stuck.QUEUED_NO_WORKER}
    services.pause_kind("test.echo", "ops", "mail API down")
    ctx = stuck.Context()
    (finding,) = stuck.find_stuck(ctx=ctx)
    assert (finding.job.pk, finding.reason, finding.remedy) == (job.pk, "queued_kind_paused", "resume_kind")
    assert "kind 'test.echo' paused by ops just now: mail API down" in finding.text
    assert stuck.check(job, ctx=ctx) == finding
    assert list(Job.objects.filter(stuck.stuck_q(stuck.QUEUED_NO_WORKER, ctx))) == []
    assert stuck.count_stuck(ctx=ctx)[stuck.QUEUED_KIND_PAUSED] == 1
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("jobstate_stuck", stdout=out)
    assert "python manage.py jobstate resume test.echo --reason" in out.getvalue()


def test_a_begun_job_is_never_handed_back_as_paused():
    # Begun by another holder of the token meanwhile, it runs: the hand-back of a
    # reserved job requeued it, its handler still running (review).
    from jobstate.services import lease

    services.enqueue("test.echo", {})
    (claimed,) = services.claim("w1")
    services.begin(claimed, claimed.lease_token, "w1:1")
    with pytest.raises(LeaseLost):
        lease._hand_back_paused(claimed, claimed.lease_token, "w1:2", timezone.now())
    job = Job.objects.get(pk=claimed.pk)
    assert job.status == Status.PROCESSING and job.started_at is not None and job.attempts == 1


def test_retention_prunes_resumed_pauses_past_the_window_never_an_active_one(other_kind):
    now = timezone.now()

    def pause(kind: str, days_ago: float, resumed_days_ago: float | None) -> KindPause:
        record = services.pause_kind(kind, "ops", "x")
        if resumed_days_ago is not None:
            services.resume_kind(kind, "ops")
        resumed = None if resumed_days_ago is None else now - timedelta(days=resumed_days_ago)
        KindPause.objects.filter(pk=record.pk).update(
            paused_at=now - timedelta(days=days_ago), resumed_at=resumed
        )
        return record

    old = [pause("test.echo", 400, 399), pause("test.echo", 50, 31)]
    recent = pause("test.echo", 40, 29)  # paused long ago, resumed within the window
    active = pause(other_kind, 400, None)  # a year paused: it stays until resumed
    dry = prune(30, dry_run=True, now=now)
    assert dry.pauses == 2 and KindPause.objects.count() == 4
    report = prune(30, now=now)
    assert report.pauses == 2 and report.as_dict()["kind_pauses"] == 2
    assert set(KindPause.objects.values_list("pk", flat=True)) == {recent.pk, active.pk}
    assert not KindPause.objects.filter(pk__in=[p.pk for p in old]).exists()
    assert services.paused_kinds() == [active]
    assert "kind_pauses" not in prune(30, now=now).as_dict()  # nothing left to delete
    with pytest.raises(KindPaused):
        services.pauses.check_not_paused(other_kind)


def test_the_prune_command_reports_the_pause_records_it_deletes():
    record = services.pause_kind("test.echo", "ops", "x")
    services.resume_kind("test.echo", "ops")
    KindPause.objects.filter(pk=record.pk).update(resumed_at=timezone.now() - timedelta(days=40))
    out = StringIO()
    call_command("jobstate_prune", "--days", "30", "--dry-run", stdout=out)
    assert "; 1 kind pause record(s) resumed before that;" in out.getvalue(), out.getvalue()
    assert KindPause.objects.count() == 1
    call_command("jobstate_prune", "--days", "30", stdout=out)
    assert KindPause.objects.count() == 0
