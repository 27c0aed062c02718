"""The Prometheus endpoint: counts after a drain, counters folded from the
history (stable across scrapes and processes), gauges, access control."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobstate import registry, services
from jobstate.exceptions import Suspend
from jobstate.metrics import gauges, totals
from jobstate.metrics.models import MetricTotal
from jobstate.services import workers
from jobstate.worker.retention import prune
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db

OPEN = {"METRICS_ACCESS": "open", "METRICS_CACHE_SECONDS": 0, "METRICS_SETTLE_SECONDS": 0}
ENQUEUED = {"from_status": "none", "to_status": "queued", "transition": "enqueue"}
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL behaviour")


@pytest.fixture(autouse=True)
def fresh_snapshot():
    gauges.reset()
    yield
    gauges.reset()


def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics/")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name != "jobstate_metrics_snapshot_age_seconds":  # changes every time
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def boom(temp_handler):
    def fail(ctx: Any) -> None:
        raise ValueError("boom")

    temp_handler("test.boom", fail, max_attempts=1)


@override_settings(JOBSTATE=OPEN)
def test_a_scrape_after_a_drain_finds_the_expected_counts(client, boom):
    for n in range(3):
        services.enqueue("test.echo", {"n": n})
    services.enqueue("test.boom", {})
    services.enqueue("test.echo", {"later": True}, run_after=None)
    assert drain() == 5
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="completed") == 4
    assert value(s, "jobstate_jobs", kind="test.boom", status="failed") == 1
    echo = {"kind": "test.echo"}
    assert (
        value(
            s,
            "jobstate_transitions_total",
            **echo,
            from_status="none",
            to_status="queued",
            transition="enqueue",
        )
        == 4
    )
    assert (
        value(
            s,
            "jobstate_transitions_total",
            **echo,
            from_status="queued",
            to_status="processing",
            transition="claim",
        )
        == 4
    )
    assert (
        value(
            s,
            "jobstate_transitions_total",
            **echo,
            from_status="processing",
            to_status="completed",
            transition="complete",
        )
        == 4
    )
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 4
    assert value(s, "jobstate_outcomes_total", kind="test.boom", outcome="failed") == 1
    assert value(s, "jobstate_queue_wait_seconds_count", **echo) == 4
    assert value(s, "jobstate_queue_wait_seconds_bucket", **echo, le="+Inf") == 4
    assert value(s, "jobstate_run_seconds_count", **echo, outcome="completed") == 4
    assert value(s, "jobstate_run_seconds_count", kind="test.boom", outcome="failed") == 1
    assert 0 <= value(s, "jobstate_run_seconds_sum", **echo, outcome="completed") < 5
    # Scraping again counts nothing twice; new work adds up.
    assert scrape(client) == s
    services.enqueue("test.echo", {})
    drain()
    s2 = scrape(client)
    assert value(s2, "jobstate_outcomes_total", **echo, outcome="completed") == 5
    assert value(s2, "jobstate_jobs", kind="test.echo", status="completed") == 5


@override_settings(JOBSTATE={**OPEN, "METRICS_SETTLE_SECONDS": 3600})
def test_young_rows_wait_until_they_settle(client):
    services.enqueue("test.echo", {})
    drain()
    s = scrape(client)
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") is None
    assert set(MetricTotal.objects.values_list("key", flat=True)) == {totals.CURSOR}
    with override_settings(JOBSTATE=OPEN):
        s = scrape(client)
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 1
    assert MetricTotal.objects.get(key=totals.key("outcomes", "test.echo", "completed")).value == 1


@override_settings(JOBSTATE={**OPEN, "METRICS_FOLD_BATCH": 3})
def test_folding_is_incremental_and_bounded(client):
    for _ in range(2):
        services.enqueue("test.echo", {})  # 2 rows: under the batch, counted from the start
    s = scrape(client)
    assert (
        value(
            s,
            "jobstate_transitions_total",
            kind="test.echo",
            from_status="none",
            to_status="queued",
            transition="enqueue",
        )
        == 2
    )
    drain()  # 4 more rows: claim, complete, claim, complete
    s = scrape(client)  # 3 folded
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 1
    s = scrape(client)  # and the last one
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="completed") == 2
    assert value(s, "jobstate_queue_wait_seconds_count", kind="test.echo") == 2
    assert scrape(client) == s


@postgres_only
@override_settings(JOBSTATE={**OPEN, "METRICS_FOLD_BATCH": 3})
def test_counters_keep_counting_after_a_rolled_back_batch_of_enqueues(client):
    services.enqueue("test.echo", {})
    scrape(client)  # cursor placed, first row counted
    with pytest.raises(RuntimeError), transaction.atomic():
        for _ in range(5):  # 5 history ids taken from the sequence, never committed
            services.enqueue("test.echo", {})
        raise RuntimeError("the import failed")
    services.enqueue("test.echo", {})
    for _ in range(5):
        s = scrape(client)
    assert value(s, "jobstate_transitions_total", kind="test.echo", **ENQUEUED) == 2


@override_settings(JOBSTATE={**OPEN, "METRICS_FOLD_BATCH": 3})
def test_counters_keep_counting_after_retention_deleted_unfolded_history(client):
    services.enqueue("test.echo", {})
    scrape(client)
    for _ in range(2):
        services.enqueue("test.echo", {})
    drain()  # 8 more history rows, not folded yet (no scrape meanwhile)
    prune(days=0)  # retention deletes the finished jobs and their history
    services.enqueue("test.echo", {})
    for _ in range(5):
        s = scrape(client)
    # 1 (folded) + the 2 pruned (retention folds the rows it deletes first) + the new one
    assert value(s, "jobstate_transitions_total", kind="test.echo", **ENQUEUED) == 4


@override_settings(JOBSTATE={**OPEN, "LEASE_SECONDS": 0.05})
def test_reaper_actions_stuck_jobs_and_oldest_ready_age(client):
    services.enqueue("test.echo", {})
    services.claim("gone-worker", limit=1)
    time.sleep(0.1)
    s = scrape(client)
    assert value(s, "jobstate_stuck_jobs", reason="lease_expired") == 1
    services.requeue_expired()
    s = scrape(client)
    assert value(s, "jobstate_reaper_actions_total", kind="test.echo", action="requeue") == 1
    assert value(s, "jobstate_outcomes_total", kind="test.echo", outcome="rescued") == 1
    assert value(s, "jobstate_stuck_jobs", reason="lease_expired") == 0
    assert 0 <= value(s, "jobstate_oldest_ready_job_age_seconds", kind="test.echo") < 5


@override_settings(JOBSTATE=OPEN)
def test_a_paused_kind_has_a_series_until_it_is_resumed(client):
    pause = services.pause_kind("test.echo", "ops", "mail API down")
    s = scrape(client)
    assert value(s, "jobstate_kind_paused_timestamp_seconds", kind="test.echo") == pause.paused_at.timestamp()
    services.resume_kind("test.echo", "ops")
    s = scrape(client)
    assert value(s, "jobstate_kind_paused_timestamp_seconds", kind="test.echo") is None


@override_settings(JOBSTATE=OPEN)
def test_live_workers_and_clusters(client):
    workers.beat("h:1:2", cluster="h:1", role="pusher")
    workers.beat("h:1:3", cluster="h:1", role="worker")
    workers.beat("h:1:4", cluster="h:1", role="worker")
    s = scrape(client)
    assert value(s, "jobstate_workers_alive", cluster="h:1", role="worker") == 2
    assert value(s, "jobstate_workers_alive", cluster="h:1", role="pusher") == 1
    assert (
        abs(value(s, "jobstate_cluster_last_heartbeat_timestamp_seconds", cluster="h:1") - time.time()) < 30
    )


@override_settings(JOBSTATE=OPEN)
def test_lease_renewals_per_process(client):
    workers.beat("h:1:2", cluster="h:1", role="pusher", renewed=4)
    workers.beat("h:1:3", cluster="h:1", role="worker", renewed=3)
    workers.beat("h:1:3", cluster="h:1", role="worker", renewed=2)
    workers.beat("h:1:3", cluster="h:1", role="worker")
    s = scrape(client)
    assert value(s, "jobstate_lease_renewals_total", cluster="h:1", process="h:1:3") == 5
    assert value(s, "jobstate_lease_renewals_total", cluster="h:1", process="h:1:2") == 4


@override_settings(JOBSTATE=OPEN)
def test_a_killed_process_s_series_ends_a_day_after_it_was_last_seen(client):
    # Nothing called forget_dead: every killed process kept its series (and admin row) for good.
    from jobstate.worker import tasks

    now = timezone.now()
    workers.beat("h:1:2", cluster="h:1", role="worker", renewed=4, now=now - timedelta(days=1, minutes=1))
    workers.beat("h:1:3", cluster="h:1", role="worker", renewed=3, now=now - timedelta(hours=23))
    assert tasks.reap() == {"requeued": 0, "failed": 0, "cancelled": 0, "dead_processes_forgotten": 1}
    s = scrape(client)
    assert value(s, "jobstate_lease_renewals_total", cluster="h:1", process="h:1:2") is None
    assert value(s, "jobstate_lease_renewals_total", cluster="h:1", process="h:1:3") == 3
    assert tasks.reap() == {"requeued": 0, "failed": 0, "cancelled": 0}


@override_settings(JOBSTATE={**OPEN, "METRICS_CACHE_SECONDS": 60})
def test_gauges_are_served_from_the_cache(client):
    services.enqueue("test.echo", {})
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 1
    services.enqueue("test.echo", {})
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 1  # cached
    enqueued = {"from_status": "none", "to_status": "queued", "transition": "enqueue"}
    assert value(s, "jobstate_transitions_total", kind="test.echo", **enqueued) == 1
    gauges.reset()
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 2
    assert value(s, "jobstate_transitions_total", kind="test.echo", **enqueued) == 2


@pytest.mark.django_db(transaction=True)
def test_a_stale_snapshot_is_served_while_a_thread_refreshes_it(client):
    with override_settings(JOBSTATE={**OPEN, "METRICS_CACHE_SECONDS": 60}):
        scrape(client)
        old = gauges.current()
    with override_settings(JOBSTATE={**OPEN, "METRICS_CACHE_SECONDS": 0.001}):
        time.sleep(0.01)
        assert gauges.current() is old  # served stale; a refresh started
        for _ in range(100):
            if gauges.current() is not old:
                break
            time.sleep(0.05)
        assert gauges.current() is not old
    # That last look may have started another refresh: let it end before the tables are
    # flushed, or its fold places a metrics cursor in the next test's database.
    for _ in range(100):
        if not gauges._refreshing:
            break
        time.sleep(0.05)


def test_access_staff_by_default(client, user, staff_user):
    from tests.api_support import grant

    assert client.get("/metrics/").status_code == 401
    client.force_login(user)
    assert client.get("/metrics/").status_code == 403
    # Counts by kind and status are about everyone's jobs: staff who may view them all.
    client.force_login(staff_user)
    assert client.get("/metrics/").status_code == 403
    client.force_login(grant(staff_user, "view_job"))
    assert client.get("/metrics/").status_code == 200


@override_settings(JOBSTATE={"METRICS_ACCESS": "token", "METRICS_TOKEN": "s3cret-token"})
def test_access_by_token(client, staff_user):
    assert client.get("/metrics/").status_code == 401
    assert client.get("/metrics/", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    client.force_login(staff_user)
    assert client.get("/metrics/").status_code == 403  # token mode: staff is not enough
    assert client.get("/metrics/", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200


@override_settings(JOBSTATE={"METRICS_ACCESS": "token", "METRICS_TOKEN": "s3cret-token\n"})
def test_a_token_read_from_a_file_with_its_newline_is_accepted(client):
    # HTTP servers strip a header's surrounding whitespace: the scraper's "Bearer s3cret-token"
    # (Prometheus trims its credentials_file too) is all that can ever arrive.
    assert client.get("/metrics/", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200
    assert client.get("/metrics/", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 403


@override_settings(JOBSTATE={"METRICS_ACCESS": "token", "METRICS_TOKEN": "s3cret-token"})
def test_the_bearer_scheme_is_case_insensitive(client):
    # RFC 9110 section 11.1: an authentication scheme is matched case-insensitively,
    # and one or more spaces part it from the credentials.
    for header in ("bearer s3cret-token", "BEARER s3cret-token", "Bearer   s3cret-token"):
        assert client.get("/metrics/", HTTP_AUTHORIZATION=header).status_code == 200, header
    for header in ("Bearers3cret-token", "Basic s3cret-token", "bearer S3CRET-TOKEN"):
        assert client.get("/metrics/", HTTP_AUTHORIZATION=header).status_code == 403, header


@pytest.mark.parametrize("token", ["", "  "])
def test_token_mode_without_a_token_refuses_every_request_and_is_an_error(client, staff_user, token):
    # Refused, not accepted: an empty "Bearer " never matches an empty token. manage.py
    # check says so (jobstate.E007) rather than leaving the scraper to find out.
    from django.core.checks import run_checks

    from tests.api_support import grant

    with override_settings(JOBSTATE={"METRICS_ACCESS": "token", "METRICS_TOKEN": token}):
        assert client.get("/metrics/").status_code == 401
        for header in ("Bearer ", "Bearer", f"Bearer {token}", "Bearer  "):
            assert client.get("/metrics/", HTTP_AUTHORIZATION=header).status_code == 403
        client.force_login(grant(staff_user, "view_job"))
        assert client.get("/metrics/").status_code == 403
        (error,) = [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.E007"]
    assert "METRICS_TOKEN" in error.msg and "refuses every request" in error.msg
    assert "METRICS_TOKEN" in error.hint
    for settings in (
        {"METRICS_ACCESS": "token", "METRICS_TOKEN": "s3cret-token"},
        {"METRICS_ACCESS": "staff"},
        {"METRICS_ACCESS": "token", "METRICS_TOKEN": 7},  # a wrong type: E003 alone
    ):
        with override_settings(JOBSTATE=settings):
            assert not [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.E007"]


@pytest.mark.parametrize("until", [True, False], ids=["until", "children"])
@override_settings(JOBSTATE=OPEN)
def test_a_suspended_job_is_not_a_retry_and_waits_once(client, temp_handler, until):
    calls: list[int] = []

    def poll(ctx: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise Suspend("not ready yet", until=timezone.now() if until else None)

    temp_handler("test.poll", poll)
    services.enqueue("test.poll", {})
    scrape(client)
    drain()
    drain()
    assert len(calls) == 2
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.poll", status="completed") == 1
    # "retried": an attempt failed and the job went back to the queue
    assert value(s, "jobstate_outcomes_total", kind="test.poll", outcome="retried") is None
    # "Enqueue to the first attempt's claim": one job, one sample
    assert value(s, "jobstate_queue_wait_seconds_count", kind="test.poll") == 1


@pytest.mark.parametrize("refunded", [1, 0])
def test_a_failure_before_the_handler_is_a_retry_only_when_charged(
    client, temp_handler, monkeypatch, refunded
):
    # A failure before the handler started requeues the job with its attempt refunded
    # (the first SETUP_FAILURES_REFUNDED times in a row): no attempt failed, so no
    # retry; it was counted as one. Past the bound it is charged: a retry.
    from jobstate.worker import runner

    real, calls = runner.Slot, []

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("can't start new thread")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "Slot", fails_once)
    temp_handler("test.setup", max_attempts=2, retry_backoff=0)
    services.enqueue("test.setup", {})
    with override_settings(JOBSTATE={**OPEN, "SETUP_FAILURES_REFUNDED": refunded}):
        scrape(client)
        with pytest.raises(RuntimeError):
            drain()
        assert drain() == 1
        s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.setup", status="completed") == 1
    retried = value(s, "jobstate_outcomes_total", kind="test.setup", outcome="retried")
    assert retried == (None if refunded else 1)
    requeued = {"from_status": "processing", "to_status": "queued", "transition": "requeue"}
    assert value(s, "jobstate_transitions_total", kind="test.setup", **requeued) == 1


@override_settings(JOBSTATE=OPEN)
def test_a_status_that_empties_reads_zero(client, temp_handler):
    services.enqueue("test.echo", {})
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 1
    assert value(s, "jobstate_jobs", kind="test.echo", status="failed") == 0
    drain()
    s = scrape(client)
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 0
    assert value(s, "jobstate_jobs", kind="test.echo", status="completed") == 1
    # A registered kind without jobs reads 0 too: its series exist from the start.
    temp_handler("test.idle", lambda ctx: None)
    assert value(scrape(client), "jobstate_jobs", kind="test.idle", status="queued") == 0


@pytest.mark.parametrize("kind", ["odd\x1fkind", "tab\tkind", "nul\x00", "del\x7f", ""])
def test_a_kind_with_a_control_character_is_refused_when_registered(kind, temp_handler):
    # The metrics' stored keys join labels with \x1f: such a kind got wrong labels.
    with pytest.raises(ValueError, match="control characters"):
        temp_handler(kind, lambda ctx: None)
    assert kind not in registry.all_handlers()


@override_settings(JOBSTATE=OPEN)
def test_an_unusual_kind_keeps_its_labels(client, temp_handler):
    kind = 'odd kind/ü "quoted" \\ back'
    temp_handler(kind, lambda ctx: None)
    services.enqueue(kind, {})
    drain()
    assert value(scrape(client), "jobstate_outcomes_total", kind=kind, outcome="completed") == 1


@override_settings(JOBSTATE=OPEN)
def test_the_admins_reap_button_is_counted_as_the_reapers(admin_client: Any) -> None:
    from django.urls import reverse

    from tests.admin_support import expired

    job = expired()
    scrape(admin_client)  # counting starts at the first scrape
    assert admin_client.post(reverse("admin:jobstate_job_reap"), {"confirmed": "yes"}).status_code == 302
    gauges.reset()
    s = scrape(admin_client)
    assert value(s, "jobstate_reaper_actions_total", kind=job.kind, action="requeue") == 1
    assert value(s, "jobstate_outcomes_total", kind=job.kind, outcome="rescued") == 1


@override_settings(JOBSTATE={**OPEN, "METRICS_CACHE_SECONDS": 60})
def test_a_process_serving_an_older_snapshot_never_reports_lower_counters(client):
    # Two web processes behind one scrape target: each caches its own snapshot. One whose
    # snapshot is older than the other's fold reported lower counters, which Prometheus
    # reads as a counter reset (rate() then counts the whole total again).
    services.enqueue("test.echo", {})
    workers.beat("h:1:3", cluster="h:1", role="worker", renewed=2)
    s = scrape(client)  # this process's snapshot, cached for a minute
    assert value(s, "jobstate_transitions_total", kind="test.echo", **ENQUEUED) == 1
    services.enqueue("test.echo", {})
    workers.beat("h:1:3", cluster="h:1", role="worker", renewed=3)
    totals.fold()  # another process's refresh: its scrapes now report 2 enqueues, 5 renewals
    s = scrape(client)
    assert value(s, "jobstate_transitions_total", kind="test.echo", **ENQUEUED) == 2
    assert value(s, "jobstate_lease_renewals_total", cluster="h:1", process="h:1:3") == 5
    assert value(s, "jobstate_jobs", kind="test.echo", status="queued") == 1  # the gauges stay cached


def test_the_job_counts_read_the_kind_status_index_alone(client):
    # COUNT(id) needs every row's id: PostgreSQL read the whole table (258 MB at a million
    # jobs, every METRICS_CACHE_SECONDS) where the (kind, status) index (7 MB) answers.
    services.enqueue("test.echo", {})
    with CaptureQueriesContext(connection) as queries:
        gauges.job_counts()
    (sql,) = [q["sql"] for q in queries.captured_queries if "GROUP BY" in q["sql"]]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table is read whole anyway
            cursor.execute(f"EXPLAIN {sql}")
            assert "Index Only Scan using jobstate_job_kind_idx" in str(cursor.fetchall())
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            assert "USING COVERING INDEX jobstate_job_kind_idx" in str(cursor.fetchall())
