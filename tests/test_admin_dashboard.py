"""The dashboard page, its numbers (jobstate.admin.stats), the SVG charts and the
capped paginator."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from jobstate.admin import charts, stats
from jobstate.admin import paginator as paginator_module
from jobstate.admin.paginator import CappedPaginator, estimated_rows
from jobstate.ids import short
from jobstate.models import Job
from jobstate.services import workers
from jobstate.states import Status
from jobstate.stuck import distinct_values
from jobstate.worker import schedules
from tests.admin_support import completed, expired, failed, processing, queued

DASHBOARD = reverse("admin:jobstate_job_dashboard")
LIST = reverse("admin:jobstate_job_changelist")


def finished_at(job: Job, moment: Any, seconds: float) -> None:
    """Time travel for a finished job: it started ``seconds`` before ``moment``."""
    Job.objects.filter(pk=job.pk).update(finished_at=moment, started_at=moment - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_dashboard_renders_counts_charts_and_workers(admin_client: Any, temp_handler: Any) -> None:
    temp_handler("test.report")
    now = timezone.now()
    for i in range(4):
        finished_at(completed(kind="test.report"), now - timedelta(minutes=i * 7), 1 + i)
    finished_at(failed(), now - timedelta(hours=3), 2)
    queued()
    busy = processing(worker="w-alpha")
    expired()
    workers.beat("h1:100:101", cluster="h1:100", role="worker", job_id=busy.pk)
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    ctx = response.context
    assert ctx["active"] == {Status.QUEUED: 1, Status.WAITING: 0, Status.PROCESSING: 2}
    assert ctx["total"] == 8 and not ctx["total_is_estimate"]
    report_row = next(r for r in ctx["kind_rows"] if r["kind"] == "test.report")
    assert report_row["total"] == 4 and report_row["active"] == 0
    assert ctx["minute"].finished == 4 and ctx["hour"].finished == 5 and ctx["hour"].failed == 1
    assert ctx["rate_day"] == "20.0%" and ctx["rate_hour"] == "0.0%"
    assert ctx["stuck_active"] == 1
    assert (ctx["workers"].alive, ctx["workers"].busy) == (1, 1)
    assert html.count("<svg") >= 4 and 'class="js-area"' in html and 'class="js-column"' in html
    assert "test.report" in html and short(busy.pk) in html
    report = next(d for d in ctx["durations"] if d["kind"] == "test.report")
    assert report["count"] == 4 and report["p50"] == "2.5s" and report["p95"] == "3.9s"
    for chart in (ctx["minute_chart"], ctx["hour_chart"], ctx["status_chart"]):
        ET.fromstring(str(chart))  # well-formed SVG


@pytest.mark.django_db
def test_dashboard_with_no_jobs(admin_client: Any) -> None:
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200 and "No jobs yet." in response.content.decode()
    assert response.context["rate_day"] == "-"


@pytest.mark.django_db
def test_dashboard_kind_links_are_url_encoded(admin_client: Any, temp_handler: Any) -> None:
    kind = "test.a&b c#d?e=1"
    temp_handler(kind)
    job = queued(kind=kind)
    html = admin_client.get(DASHBOARD).content.decode()
    assert f'href="{LIST}?kind=test.a%26b+c%23d%3Fe%3D1"' in html
    assert "?kind=test.a&amp;b" not in html
    response = admin_client.get(f"{LIST}?kind=test.a%26b+c%23d%3Fe%3D1")
    assert response.status_code == 200 and short(job.pk) in response.content.decode()


@pytest.mark.django_db
def test_dashboard_needs_view_permission(client: Any, staff_user: Any, viewer: Any) -> None:
    client.force_login(staff_user)
    assert client.get(DASHBOARD).status_code == 403
    client.force_login(viewer)
    assert client.get(DASHBOARD).status_code == 200


@pytest.mark.django_db
def test_throughput_buckets_and_failure_rate() -> None:
    now = timezone.now().replace(second=30, microsecond=0)
    for minutes, make in ((0, completed), (0, completed), (5, failed), (59, completed), (61, completed)):
        job = make()
        finished_at(job, now - timedelta(minutes=minutes), 1)
    hour = stats.throughput(now, span=timedelta(hours=1), bucket="minute")
    assert len(hour.times) == 60 and hour.times[-1] == now.replace(second=0)
    assert hour.by_status[Status.COMPLETED][-1] == 2
    assert hour.by_status[Status.FAILED][-6] == 1
    assert hour.finished == 4 and hour.failure_rate == 0.25
    day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
    assert len(day.times) == 24 and day.finished == 5


@pytest.mark.django_db
def test_the_totals_cover_the_whole_window_before_its_first_bucket(admin_client: Any) -> None:
    # The hourly bars start at the top of the hour 23 hours ago: the "last 24 h" tile,
    # the failure rate and the status bars left out up to an hour of finished jobs.
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    early, inside = failed(), completed()
    finished_at(early, now - timedelta(hours=23, minutes=50), 1)  # before the first bar
    finished_at(inside, now - timedelta(hours=1), 1)
    day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
    assert len(day.times) == 24 and sum(map(sum, day.by_status.values())) == 1
    assert (day.finished, day.failed, day.failure_rate) == (2, 1, 0.5)
    assert day.total(Status.FAILED) == 1
    minute = stats.throughput(now, span=timedelta(hours=1), bucket="minute")
    assert minute.finished == 1  # the job of an hour ago is in the hour's window too


@pytest.mark.django_db
def test_durations_per_kind() -> None:
    now = timezone.now()
    for seconds in (1, 2, 3, 4, 100):
        finished_at(completed(), now - timedelta(minutes=1), seconds)
    finished_at(completed(), now - timedelta(days=2), 1000)  # outside the window
    (row,) = stats.durations(now)
    assert row.kind == "test.echo" and row.count == 5
    assert row.p50 == pytest.approx(3.0) and row.p95 == pytest.approx(80.8)


@pytest.mark.django_db
def test_durations_count_every_job_of_the_window_beyond_the_sample(
    monkeypatch: pytest.MonkeyPatch, temp_handler: Any
) -> None:
    # Off PostgreSQL the percentiles come from the most recent jobs; the "Jobs" column
    # counted that sample (5,000 in all kinds), not the jobs of the last 24 hours.
    temp_handler("test.rare")
    monkeypatch.setattr(stats, "DURATION_SAMPLE", 3)
    now = timezone.now()
    for minutes in range(5):
        finished_at(completed(), now - timedelta(minutes=minutes), 2)
    finished_at(completed(kind="test.rare"), now - timedelta(hours=2), 7)  # older than the sample
    rows = {d.kind: d for d in stats.durations(now)}
    assert rows["test.echo"].count == 5 and rows["test.echo"].p50 == pytest.approx(2.0)
    # PostgreSQL's percentiles cover every job; elsewhere this one is not in the sample.
    assert rows["test.rare"].count == 1
    assert rows["test.rare"].p50 == (7.0 if connection.vendor == "postgresql" else None)


def test_percentile_matches_percentile_cont() -> None:
    assert stats.percentile([], 0.5) is None
    assert stats.percentile([5.0], 0.95) == 5.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert stats.percentile([10.0, 0.0], 0.95) == pytest.approx(9.5)


def test_charts_are_escaped_and_well_formed() -> None:
    svg = charts.bar_chart([charts.Bar("<script>", 3, "#000", href="/x?a=1&b=2")], label='a "b" <c>')
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    ET.fromstring(str(svg))
    times = [timezone.now() - timedelta(minutes=i) for i in range(5)][::-1]
    for kind in ("area", "columns"):
        svg = charts.time_chart(
            times, [charts.Series("<b>", "#123", [0, 1, 2, 3, 400])], label="t", kind=kind
        )
        root = ET.fromstring(str(svg))
        assert root.tag.endswith("svg") and "&lt;b&gt;" in svg
    assert "no data" in charts.time_chart([], [], label="empty")
    assert charts.nice_max(0) == 1 and charts.nice_max(7) == 10 and charts.nice_max(101) == 200


@pytest.mark.django_db
def test_capped_paginator_and_list_label(admin_client: Any) -> None:
    for _ in range(7):
        queued()
    paginator = CappedPaginator(Job.objects.filter(status=Status.QUEUED), 2, cap=5)
    assert paginator.count == 5 and paginator.is_capped and paginator.num_pages == 3
    assert paginator.count_label == "more than 5"
    assert CappedPaginator(Job.objects.filter(status=Status.QUEUED), 2, cap=50).count == 7
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 5}):
        html = admin_client.get(f"{LIST}?status=queued").content.decode()
    assert "more than 5 jobs" in html and "counted up to 5" in html


def total_tile(html: str) -> str:
    found = re.search(
        r'<span class="js-tile-n">([^<]*)</span><span class="js-tile-l">(jobs in all[^<]*)</span>', html
    )
    assert found, html
    return " ".join(found.groups())


@pytest.mark.django_db
def test_the_total_tile_says_what_the_list_it_links_to_says(admin_client: Any, monkeypatch: Any) -> None:
    # A count capped at ADMIN_COUNT_CAP is a lower bound (the list: "more than 3"),
    # not an estimate: the tile said "≈3 jobs in all (estimate)".
    for _ in range(5):
        queued()
    monkeypatch.setattr(paginator_module, "estimated_rows", lambda qs: None)
    assert total_tile(admin_client.get(DASHBOARD).content.decode()) == "5 jobs in all"
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 3}):
        assert total_tile(admin_client.get(DASHBOARD).content.decode()) == "3+ jobs in all"
        assert "more than 3 jobs" in admin_client.get(LIST).content.decode()
    # PostgreSQL's estimate of a large table: as the list, "about", with thousands separators.
    monkeypatch.setattr(paginator_module, "estimated_rows", lambda qs: 1234567)
    with override_settings(JOBSTATE={"ADMIN_COUNT_CAP": 3}):
        assert total_tile(admin_client.get(DASHBOARD).content.decode()) == "≈1,234,567 jobs in all (estimate)"
        assert "about 1,234,567 jobs" in admin_client.get(LIST).content.decode()


@pytest.mark.django_db
def test_unfiltered_list_uses_the_planner_estimate_on_postgresql() -> None:
    for _ in range(12):
        queued()
    qs = Job.objects.all()
    if connection.vendor != "postgresql":
        assert estimated_rows(qs) is None
        assert CappedPaginator(qs, 5, cap=10).is_capped is False
        assert CappedPaginator(qs, 5, cap=10).count == 10
        return
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    assert estimated_rows(qs) == 12
    paginator = CappedPaginator(qs, 5, cap=10)
    assert paginator.count == 12 and paginator.is_estimate and paginator.count_label == "about 12"
    # A filtered list is never estimated.
    assert CappedPaginator(qs.filter(status=Status.QUEUED), 5, cap=10).is_estimate is False


@pytest.mark.django_db
def test_distinct_values_hops_through_the_index(user: Any, other_user: Any) -> None:
    queued(kind="test.limited")
    queued(user)
    queued(other_user)
    queued(user)
    assert distinct_values(Job, "kind") == ["test.echo", "test.limited"]
    assert distinct_values(Job, "owner_id") == sorted([user.pk, other_user.pk])
    assert distinct_values(Job, "kind", limit=1) == ["test.echo"]


@pytest.mark.django_db
def test_kind_counts_read_active_jobs_and_the_last_day_only() -> None:
    now = timezone.now()
    queued()
    processing()
    finished_at(completed(), now - timedelta(hours=2), 1)
    finished_at(failed(), now - timedelta(days=3), 1)  # history, not read
    by_kind = stats.kind_counts(now - timedelta(days=1))
    assert by_kind["test.echo"] == {
        Status.QUEUED: 1,
        Status.WAITING: 0,
        Status.PROCESSING: 1,
        Status.COMPLETED: 1,
        Status.PARTIAL: 0,
        Status.FAILED: 0,
        Status.CANCELLED: 0,
    }
    assert stats.active_counts(by_kind) == {Status.QUEUED: 1, Status.WAITING: 0, Status.PROCESSING: 1}
    counted = stats.counted_jobs()
    assert (counted.count, counted.is_estimate, counted.is_capped) == (4, False, False)


@pytest.mark.django_db
def test_dashboard_warns_until_the_schedules_are_installed(admin_client: Any, settings: Any) -> None:
    # Nothing told an operator that jobstate_schedule never ran: no prune, the job table grew.
    settings.JOBSTATE = {"RETENTION_DAYS": 30}
    warning = admin_client.get(DASHBOARD).context["schedules_missing"]
    assert warning.startswith("jobstate's schedules are not installed: finished jobs are never deleted")
    assert "(RETENTION_DAYS is 30)" in warning and "Run manage.py jobstate_schedule" in warning
    assert 'id="js-schedules-missing"' in admin_client.get(DASHBOARD).content.decode()
    schedules.install(prune=False)  # the prune left out is the operator's choice
    assert admin_client.get(DASHBOARD).context["schedules_missing"] == ""
    assert 'id="js-schedules-missing"' not in admin_client.get(DASHBOARD).content.decode()
    schedules.uninstall()
    settings.JOBSTATE = {"RETENTION_DAYS": None}
    warning = admin_client.get(DASHBOARD).context["schedules_missing"]
    assert "never deleted" not in warning and "no backstop" in warning


@pytest.mark.django_db
def test_dashboard_warns_without_django_q2_s_schedule_table(admin_client: Any) -> None:
    # django-q2 not migrated: the failed read is rolled back to its savepoint, so the
    # request's transaction (here the test's) still works on PostgreSQL.
    with mock.patch.object(Schedule._meta, "db_table", "no_such_schedule_table"):
        response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    assert "Run manage.py jobstate_schedule" in response.context["schedules_missing"]
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_every_count_has_thousands_separators(admin_client: Any, temp_handler: Any) -> None:
    """The total tile said "3,006 jobs in all" beside "2692 finished" and a kind's "1002"."""
    temp_handler("test.report")
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            kind="test.report",
            status=Status.COMPLETED,
            started_at=now - timedelta(seconds=2),
            finished_at=now - timedelta(seconds=1),
        )
        for _ in range(1234)
    )
    workers.beat("h1:100:101", cluster="h1:100", role="worker", finished=2345)
    html = admin_client.get(DASHBOARD).content.decode()
    assert '<span class="js-tile-n">1,234</span><span class="js-tile-l">finished, last 24 h' in html
    assert "1,234 finished, 0 failed" in html  # the charts' headings
    assert 'title="Completed: 1,234"' in html and '"0 active">1,234</td>' in html  # jobs by kind
    assert "<td>1,234</td>" in html and "<td>2,345</td>" in html  # run times, workers
    assert not re.search(r"(?<![\d.,])(1234|2345)(?![\d.])", html)
    workers_list = admin_client.get(reverse("admin:jobstate_workerprocess_changelist")).content.decode()
    assert '<td class="field-done_col">2,345</td>' in workers_list
