"""The dashboard page: what runs now, what finished lately, how fast, who works.

Every number comes from a bounded, indexed query (see ``jobstate.admin.stats``):
active jobs are counted exactly, finished ones over the last hour and day, and
the all-time total is PostgreSQL's estimate on a large table.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.apps import apps
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from jobstate import conf, stuck
from jobstate.admin import charts, display, pauses, stats, workers
from jobstate.admin.paginator import CappedPaginator
from jobstate.admin.views import page_context
from jobstate.states import Status

FINISHED = [Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.CANCELLED]
KIND_ROWS = 20
BADGE_CAP = 100  # stuck counts on the tile stop here ("100+"); the stuck page counts further


def _series(t: stats.Throughput) -> list[charts.Series]:
    return [charts.Series(Status(s).label, display.STATUS_COLOURS[s], t.by_status[s]) for s in FINISHED]


def _kind_rows(by_kind: dict[str, dict[str, int]], changelist: str) -> list[dict[str, Any]]:
    top = max((sum(c.values()) for c in by_kind.values()), default=0)
    rows = []
    for kind, counts in list(by_kind.items())[:KIND_ROWS]:
        segments = [
            {
                "label": Status(s).label,
                "n": counts[s],
                "colour": display.STATUS_COLOURS[s],
                "width": 100 * counts[s] / top if top else 0,
            }
            for s in Status.values
            if counts[s]
        ]
        rows.append(
            {
                "kind": kind,
                "total": sum(counts.values()),
                "active": counts[Status.QUEUED] + counts[Status.WAITING] + counts[Status.PROCESSING],
                "segments": segments,
                "url": f"{changelist}?{urlencode({'kind': kind})}",
            }
        )
    return rows


def dashboard_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    now = timezone.now()
    day_ago = now - timedelta(days=1)
    changelist = reverse("admin:jobstate_job_changelist")
    by_kind = stats.kind_counts(day_ago)
    active = stats.active_counts(by_kind)
    counted = stats.counted_jobs()
    minute = stats.throughput(now, span=timedelta(hours=1), bucket="minute")
    hour = stats.throughput(now, span=timedelta(days=1), bucket="hour")
    times = stats.durations(now)
    # One past the cap, so that "100+" says more than 100.
    ctx = stuck.Context()  # the database's clock (one query on PostgreSQL), read once
    stuck_counts = stuck.count_stuck(cap=BADGE_CAP + 1, ctx=ctx)
    stuck_active = {c: n for c, n in stuck_counts.items() if c in stuck.ACTIVE_REASONS}
    colours = display.STATUS_COLOURS
    bars = [
        charts.Bar(Status(s).label, n, colours[s], href=f"{changelist}?status={s}", note="now")
        for s, n in active.items()
    ] + [
        charts.Bar(Status(s).label, hour.total(s), colours[s], href=f"{changelist}?status={s}", note="24 h")
        for s in FINISHED
    ]
    top_p95 = max((d.p95 or 0 for d in times), default=0)
    context = page_context(
        model_admin,
        request,
        "Jobs dashboard",
        now=now,
        active=active,
        total=counted.count,
        total_is_estimate=counted.is_estimate or counted.is_capped,
        total_label=_total_label(counted),
        total_estimated=counted.is_estimate,
        status_chart=charts.bar_chart(bars, label="Active jobs now and jobs finished in the last 24 hours"),
        kind_rows=_kind_rows(by_kind, changelist),
        more_kinds=max(0, len(by_kind) - KIND_ROWS),
        minute_chart=charts.time_chart(
            minute.times, _series(minute), label="Jobs finished per minute, last hour", tick_format="%H:%M"
        ),
        hour_chart=charts.time_chart(
            hour.times,
            _series(hour),
            label="Jobs finished per hour, last 24 hours",
            tick_format="%H:%M",
            kind="columns",
        ),
        minute=minute,
        hour=hour,
        rate_hour=_pct(minute.failure_rate),
        rate_day=_pct(hour.failure_rate),
        durations=[
            {
                "kind": d.kind,
                "count": d.count,
                "p50": display.seconds_label(d.p50),
                "p95": display.seconds_label(d.p95),
                "bar": charts.spark_range(d.p50, d.p95, top_p95),
            }
            for d in times
        ],
        **workers.panel_context(ctx.now),  # by the database's clock, as seen_at is written
        live_active=sum(active.values()),
        stuck_total=sum(min(BADGE_CAP, n) for n in stuck_counts.values()),
        stuck_capped=any(n > BADGE_CAP for n in stuck_counts.values()),
        stuck_active=sum(min(BADGE_CAP, n) for n in stuck_active.values()),
        stuck_active_capped=any(n > BADGE_CAP for n in stuck_active.values()),
        stuck_failed=sum(min(BADGE_CAP, n) for c, n in stuck_counts.items() if c not in stuck_active),
        stuck_failed_capped=any(n > BADGE_CAP for c, n in stuck_counts.items() if c not in stuck_active),
        colours=colours,
        schedules_missing=_schedules_missing(),
        **pauses.dashboard_context(model_admin, request),
    )
    return TemplateResponse(request, "admin/jobstate/job/dashboard.html", context)


def _schedules_missing() -> str:
    """What does not run for want of ``manage.py jobstate_schedule`` ("" when it ran):
    nothing else tells an operator, and the job table grows for good without the prune."""
    if not apps.is_installed("django_q"):
        return ""  # W013 says so: no worker runs anything
    from jobstate.worker import schedules

    try:
        with transaction.atomic():  # a savepoint: the page's other queries still run
            missing = {item.name for item in schedules.missing()}
    except DatabaseError:  # django-q2 not migrated: its Schedule table is missing
        missing = {item.name for item in schedules.wanted()}
    if not missing:
        return ""
    lost = []
    if schedules.PRUNE in missing:
        lost.append(f"finished jobs are never deleted (RETENTION_DAYS is {conf.get('RETENTION_DAYS')})")
    lost.append("worker processes gone for a day stay listed and the clusters' reaper has no backstop")
    return (
        f"jobstate's schedules are not installed: {'; '.join(lost)}. Run manage.py jobstate_schedule "
        "once per database, after migrate."
    )


def _total_label(counted: CappedPaginator) -> str:
    # As the job list it links to says it: a capped count is a lower bound ("more
    # than"), only PostgreSQL's row estimate is one ("about").
    if counted.is_capped:
        return f"{counted.count:,}+"
    return f"≈{counted.count:,}" if counted.is_estimate else f"{counted.count:,}"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"
