"""The job list's columns: badges, bars, attempts, age, a stuck flag."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate import stuck
from jobstate.admin import display, own_jobs
from jobstate.ids import short
from jobstate.models import Job
from jobstate.states import ACTIVE, Status

if TYPE_CHECKING:  # a mixin of ModelAdmins of Job: checked as one
    _JobAdmin = admin.ModelAdmin[Job]
else:
    _JobAdmin = object


def share_stuck_context(request: HttpRequest, rows: Iterable[Job]) -> None:
    """Give every row the status column flags one stuck-detection context: the one
    the request already made (``JobAdmin.changelist_view``), else a new one kept on
    the request. Built per row, each would read the database's clock (PostgreSQL)
    and the served kinds again."""
    ctx: stuck.Context | None = getattr(request, "_jobstate_stuck_ctx", None)
    for row in rows:
        if row.status in (Status.QUEUED, Status.PROCESSING) and getattr(row, "_stuck_ctx", None) is None:
            if ctx is None:
                ctx = request._jobstate_stuck_ctx = stuck.Context()  # type: ignore[attr-defined]
            row._stuck_ctx = ctx  # type: ignore[attr-defined]


class JobColumns(_JobAdmin):
    """List-display methods for ``JobAdmin`` (mixed in), and for a host project's
    own ModelAdmin of jobs."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        response = super().changelist_view(request, extra_context)
        # A page still to be rendered only: an action's redirect reads no rows.
        if isinstance(response, TemplateResponse) and not response.is_rendered:
            cl = (response.context_data or {}).get("cl")
            if cl is not None:
                share_stuck_context(request, cl.result_list)
                own_jobs.load_skipped(cl.result_list)
        return response

    def action_checkbox(self, obj: Job) -> SafeString:
        # Django renders this through the form widget templates: ~1 ms a row.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" '
            'aria-label="Select this object for an action - {}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            str(obj),
        )

    @admin.display(description="job")
    def short_id(self, obj: Job) -> SafeString:
        # data-job/data-active: the rows the live refresh (jobstate/live.js) follows.
        return format_html(
            '<code title="{}" data-job="{}" data-active="{}">{}</code>',
            obj.pk,
            obj.pk,
            "1" if obj.status in ACTIVE else "0",
            short(obj.pk),
        )

    @admin.display(description="status")
    def status_col(self, obj: Job) -> SafeString:
        badge = display.status_badge(obj.status)
        if obj.status not in (Status.QUEUED, Status.PROCESSING):
            return own_jobs.status_note(obj, badge)
        finding = _active_finding(obj, getattr(obj, "_stuck_ctx", None) or stuck.Context())
        if finding is None:
            if obj.cancel_requested_at:
                return format_html('{} <span class="js-flag">cancelling</span>', badge)
            return badge
        title = f"{finding.title}: {finding.text}"
        return format_html('{} <span class="js-stuck" title="{}">⚠ {}</span>', badge, title, finding.short)

    @admin.display(description="owner")
    def owner_col(self, obj: Job) -> str:
        return obj.owner.get_username() if obj.owner is not None else "—"

    @admin.display(description="progress / step")
    def progress_col(self, obj: Job) -> SafeString:
        bar = display.progress_bar(obj.progress, obj.progress_message, obj.status)
        if not obj.current_step:
            return bar
        return format_html('{}<span class="js-step">{}</span>', bar, obj.current_step)

    @admin.display(description="attempts")
    def attempts_col(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="created", ordering="created_at")
    def created_col(self, obj: Job) -> SafeString:
        return display.compact_time(obj.created_at)

    @admin.display(description="age / duration")
    def age_col(self, obj: Job) -> SafeString:
        return age_or_duration(obj, timezone.now())


def _active_finding(job: Job, ctx: stuck.Context) -> stuck.Finding | None:
    for r in stuck.REASONS:
        if r.code in stuck.ACTIVE_REASONS and r.check(job, ctx):
            return stuck.Finding(
                job, r.code, r.title, r.describe(job, ctx), r.remedy, r.remedy_text, None, r.short
            )
    return None


def age_or_duration(job: Job, now: datetime) -> SafeString:
    if job.status == Status.WAITING:
        return format_html('<span class="js-muted">{}</span>', "waiting for children")
    if job.status == Status.QUEUED:
        if job.run_after > now:
            return format_html(
                '<span class="js-muted">runs in {}</span>', display.short_duration(job.run_after - now)
            )
        return format_html("waiting {}", display.since(max(job.created_at, job.run_after), now))
    if job.status == Status.PROCESSING:
        if job.started_at is None:  # reserved by a cluster, not begun by a worker yet
            return format_html(
                '<span class="js-muted">reserved {}</span>', display.since(job.heartbeat_at, now)
            )
        return format_html("running {}", display.since(job.started_at, now))
    if job.started_at is None:
        return format_html('<span class="js-muted">{}</span>', "never ran")
    return format_html("took {}", display.short_duration(job.duration))
