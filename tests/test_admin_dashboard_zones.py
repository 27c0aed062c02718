"""The dashboard's throughput buckets across daylight-saving changes and in zones
whose offset is not a whole number of hours (jobstate.admin.stats.throughput)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.urls import reverse

from jobstate.admin import dashboard, stats
from jobstate.models import Job
from jobstate.states import Status
from tests.admin_support import completed

NEW_YORK = ZoneInfo("America/New_York")
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


@pytest.fixture
def new_york() -> Iterator[None]:
    with override_settings(TIME_ZONE="America/New_York"):
        yield


def finished(*moments: datetime) -> None:
    """One completed job finished at each of ``moments``."""
    job = completed()
    Job.objects.filter(pk=job.pk).update(finished_at=moments[0], started_at=moments[0] - MINUTE)
    for moment in moments[1:]:
        job.pk = None  # a copy, with a new id
        job.finished_at, job.started_at = moment, moment - MINUTE
        job.save(force_insert=True)


def labels(t: stats.Throughput, fmt: str = "%H:%M") -> list[str]:
    return [moment.strftime(fmt) for moment in t.times]


def bars(t: stats.Throughput) -> list[int]:
    return [sum(counts) for counts in zip(*t.by_status.values(), strict=True)]


def assert_absolute(t: stats.Throughput, step: timedelta) -> None:
    """Every bar is ``step`` of real time after the one before it."""
    starts = [moment.astimezone(UTC) for moment in t.times]
    assert all(b - a == step for a, b in pairwise(starts))


@pytest.mark.django_db
def test_hourly_bars_at_spring_forward_cover_real_hours(new_york: None) -> None:
    # 2026-03-08 02:00 EST became 03:00 EDT. The bars had an always-empty 02:00 and
    # the jobs of one real hour were counted only in the totals.
    now = datetime(2026, 3, 8, 12, 30, tzinfo=NEW_YORK).astimezone(UTC)  # as the dashboard has it
    first = datetime(2026, 3, 7, 12, 0, tzinfo=NEW_YORK).astimezone(UTC)  # 23 hours before 12:00 EDT
    finished(*(first + i * HOUR + 10 * MINUTE for i in range(24)), first - 20 * MINUTE)
    day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
    assert_absolute(day, HOUR)
    shown = labels(day)
    assert len(shown) == 24 and "02:00" not in shown
    assert shown[:2] == ["12:00", "13:00"] and shown[-1] == "12:00"
    assert shown[shown.index("01:00") + 1] == "03:00"
    assert bars(day) == [1] * 24
    assert day.earlier == {Status.COMPLETED: 1} and day.finished == 25


@pytest.mark.django_db
def test_hourly_bars_at_fall_back_show_01_00_twice(new_york: None) -> None:
    # 2026-11-01 02:00 EDT became 01:00 EST: the bar of 01:00 held both hours' jobs.
    now = datetime(2026, 11, 1, 12, 30, tzinfo=NEW_YORK).astimezone(UTC)
    first = datetime(2026, 10, 31, 14, 0, tzinfo=NEW_YORK).astimezone(UTC)  # 23 hours before 12:00 EST
    finished(*(first + i * HOUR + 10 * MINUTE for i in range(24)))
    day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
    assert_absolute(day, HOUR)
    shown = labels(day)
    assert len(shown) == 24 and shown.count("01:00") == 2 and shown[0] == "14:00" and shown[-1] == "12:00"
    assert bars(day) == [1] * 24 and day.earlier == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("now", "gap"),
    [
        (datetime(2026, 3, 8, 3, 30, tzinfo=NEW_YORK), ["01:59", "03:00"]),
        (datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=NEW_YORK), ["01:59", "01:00"]),
    ],
)
def test_minute_bars_across_a_clock_change_cover_real_minutes(
    new_york: None, now: datetime, gap: list[str]
) -> None:
    # ``now`` in local time: the window is still the last 60 real minutes, not the clock's.
    first = now.astimezone(UTC) - 59 * MINUTE
    finished(*(first + i * MINUTE + timedelta(seconds=5) for i in range(60)))
    hour = stats.throughput(now, span=HOUR, bucket="minute")
    assert_absolute(hour, MINUTE)
    shown = labels(hour)
    assert len(shown) == 60 and shown[0] == "01:31" and shown[-1] == now.strftime("%H:%M")
    assert shown[28:30] == gap
    assert bars(hour) == [1] * 60 and hour.earlier == {}


@pytest.mark.django_db
@pytest.mark.parametrize(("zone", "offset"), [("Asia/Kolkata", "+0530"), ("Asia/Kathmandu", "+0545")])
def test_hourly_bars_start_at_local_whole_hours_in_half_hour_zones(zone: str, offset: str) -> None:
    # An absolute hour cut in UTC starts at :30 (or :45) there; the bars start at :00
    # as the clock there shows it, each still 60 real minutes.
    with override_settings(TIME_ZONE=zone):
        now = datetime(2026, 3, 8, 12, 50, tzinfo=ZoneInfo(zone))
        finished(now - 45 * MINUTE, now - 55 * MINUTE, now - 23 * HOUR - 55 * MINUTE)
        day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
        assert_absolute(day, HOUR)
        assert {m.strftime("%M%z") for m in day.times} == {"00" + offset}
        assert labels(day)[-2:] == ["11:00", "12:00"]
        assert bars(day)[-2:] == [1, 1]
        assert day.earlier == {Status.COMPLETED: 1}


@pytest.mark.django_db
def test_hourly_labels_say_the_half_hour_where_the_clock_moved_by_half_an_hour(admin_client: Any) -> None:
    # Lord Howe Island moves its clock by 30 minutes (+11:00 in summer, +10:30 in winter):
    # the bars start at whole hours on today's clock, at half past before the change.
    zone = ZoneInfo("Australia/Lord_Howe")
    now = datetime(2026, 4, 5, 12, 10, tzinfo=zone)  # 02:00 +11:00 became 01:30 +10:30
    with override_settings(TIME_ZONE="Australia/Lord_Howe"):
        day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
        assert_absolute(day, HOUR)
        assert labels(day)[-1] == "12:00" and labels(day)[0] == "13:30"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dashboard.timezone, "now", lambda: now)
            chart = str(admin_client.get(reverse("admin:jobstate_job_dashboard")).context["hour_chart"])
    assert [">13:30<" in chart, ">01:30<" in chart, ">05:00<" in chart] == [True, True, True]  # ticks


@pytest.mark.django_db
def test_without_use_tz_the_bars_are_hours_of_the_stored_wall_clock() -> None:
    # Naive times in TIME_ZONE cannot tell the two 01:00 hours of a fall back apart:
    # the bars are wall-clock hours, as stored.
    jobs = [completed().pk for _ in range(3)]
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        now = datetime(2026, 11, 1, 12, 30)
        for pk, moment in zip(
            jobs, (datetime(2026, 11, 1, 1, 10), datetime(2026, 11, 1, 1, 20), now), strict=True
        ):
            Job.objects.filter(pk=pk).update(finished_at=moment - MINUTE, started_at=moment - HOUR)
        day = stats.throughput(now, span=timedelta(days=1), bucket="hour")
        assert len(day.times) == 24 and labels(day)[0] == "13:00" and labels(day).count("01:00") == 1
        assert bars(day)[labels(day).index("01:00")] == 2 and bars(day)[-1] == 1
        assert day.finished == 3
