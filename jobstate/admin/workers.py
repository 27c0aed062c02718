"""Worker processes: the dashboard's workers panel and a read-only list.

Every cluster process (the pusher and each worker process) upserts its
``WorkerProcess`` row every few seconds, busy or idle, through
``jobstate.services.workers.beat``. A process seen within
``WORKER_ALIVE_SECONDS`` is alive (idle or busy); an older one is shown as dead
for an hour (``stats.DEAD_SHOWN``), so an idle cluster and a dead one look different.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate import conf
from jobstate.admin import display, stats
from jobstate.admin.changelist import SafeListAdmin
from jobstate.admin.exact_times import ShownAs
from jobstate.admin.views import job_url
from jobstate.ids import short
from jobstate.models import WorkerProcess
from jobstate.models.job import LeaseClock, may_view_all
from jobstate.worker import clock

STATE_CLASSES = {"busy": "processing", "idle": "completed", "alive": "completed", "dead": "failed"}


def state_badge(state: str) -> SafeString:
    return format_html(
        '<span class="js-badge js-badge-{} js-state-{}">{}</span>', STATE_CLASSES[state], state, state
    )


def _whole_seconds(moment: datetime, now: datetime) -> str:
    """``0s``, ``7s``, ``3m 07s``: a heartbeat's age in whole seconds (short_duration's
    ``0ms`` and ``1.0s`` read a precision the beat interval does not have)."""
    seconds = max(0, round((now - moment).total_seconds()))
    return f"{seconds}s" if seconds < 10 else display.short_duration(timedelta(seconds=seconds))


def panel_context(now: datetime | None = None) -> dict[str, Any]:
    """What ``jobstate/workers_panel.html`` shows, as of ``now`` (None: the
    database's clock on PostgreSQL, which ``seen_at`` is written by)."""
    now = now or LeaseClock.read()
    found = stats.workers(now)
    clusters = []
    for c in found.clusters:
        rows = []
        for p in c.processes:
            rows.append(
                {
                    "process": p,
                    "badge": state_badge(p.state),
                    "seen": _whole_seconds(p.seen_at, now),
                    "up": _whole_seconds(p.started_at, now),
                    "job_url": job_url(p.job_id) if p.job_id else "",
                    "job_short": short(p.job_id) if p.job_id else "",
                }
            )
        clusters.append({"cluster": c, "rows": rows})
    return {"workers": found, "worker_clusters": clusters, "workers_window": found.alive_seconds}


def render_panel(request: HttpRequest, panel: dict[str, Any]) -> str:
    """The panel's HTML from its ``panel_context``."""
    return render_to_string("jobstate/workers_panel.html", panel, request=request)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(SafeListAdmin, ShownAs, admin.ModelAdmin):
    """Every process row, alive or dead: read-only (the processes write them)."""

    exact_times = ("started_at", "seen_at")

    list_display = (
        "name",
        "role",
        "state_col",
        "job_col",
        "seen_col",
        "clock_col",
        "started_col",
        "done_col",
    )
    list_filter = ("role", "cluster")
    search_fields = ("name", "cluster", "host")
    ordering = ("cluster", "role", "name")
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    actions = None

    class Media:
        css = {"all": ("jobstate/admin.css",)}

    # Read-only; visible to whoever may view jobs (the one rule: view_job or change_job,
    # as the dashboard's workers panel), or holds the model's own view permission: a row
    # is infrastructure (a process's host, pid, heartbeat and clock), not a job's data,
    # for whoever watches the workers without seeing jobs. The one job field, the job a
    # process runs now, is shown only to those who may view jobs (the history's and the
    # assets' rule).

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return bool(user.has_perm("jobstate.view_workerprocess")) or may_view_all(user)

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)
        return shown if may_view_all(request.user) else tuple(c for c in shown if c != "job_col")

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        return None if may_view_all(request.user) else ("job_id",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a dead row goes by itself (services.workers.forget_dead)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerProcess]:
        # The database's clock with each row (no query of its own): seen_at is written by it.
        rows: QuerySet[WorkerProcess] = super().get_queryset(request)
        return rows.annotate(clock_now=LeaseClock())

    @staticmethod
    def _now(obj: WorkerProcess) -> datetime:
        now: datetime | None = getattr(obj, "clock_now", None)
        return now or timezone.now()

    @classmethod
    def _alive(cls, obj: WorkerProcess) -> bool:
        return obj.seen_at >= cls._now(obj) - timedelta(seconds=float(conf.get("WORKER_ALIVE_SECONDS")))

    @admin.display(description="state")
    def state_col(self, obj: WorkerProcess) -> SafeString:
        if not self._alive(obj):
            return state_badge("dead")
        if obj.role != WorkerProcess.Role.WORKER:
            return state_badge("alive")
        return state_badge("busy" if obj.job_id else "idle")

    @admin.display(description="current job")
    def job_col(self, obj: WorkerProcess) -> SafeString:
        if not obj.job_id or not self._alive(obj):
            return format_html("{}", "—")
        return format_html('<a href="{}"><code>{}</code></a>', job_url(obj.job_id), short(obj.job_id))

    @admin.display(description="last heartbeat", ordering="seen_at")
    def seen_col(self, obj: WorkerProcess) -> str:
        return f"{_whole_seconds(obj.seen_at, self._now(obj))} ago"

    @admin.display(description="started", ordering="started_at")
    def started_col(self, obj: WorkerProcess) -> SafeString:
        # Django's "Nov. 30, 2026, 1:26 p.m." pushed the last column out of a 1440 px list.
        return display.compact_time(obj.started_at)

    @admin.display(description="jobs done", ordering="jobs_done")
    def done_col(self, obj: WorkerProcess) -> str:
        return f"{obj.jobs_done:,}"  # as the admin writes every count

    @admin.display(description="clock offset", ordering="clock_offset")
    def clock_col(self, obj: WorkerProcess) -> SafeString:
        """How far the process's clock is from the database's (PostgreSQL), flagged
        past ``clock.limit()``: the times it records are off by as much."""
        offset = obj.clock_offset
        if offset is None:
            return format_html("{}", "—")
        shown = f"{offset:+.2f} s"
        if not clock.past_limit(offset):
            return format_html("{}", shown)
        side = "ahead of" if offset > 0 else "behind"
        return format_html(
            '<span class="js-badge js-badge-failed" title="{}">{}</span>',
            f"{side} the database's clock by more than a quarter of HEARTBEAT_SECONDS"
            f" ({clock.limit():g} s): the times it records are off by as much",
            shown,
        )
