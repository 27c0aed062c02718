"""The Job admin: a fast list, a read-only job page, and operator buttons that
go through ``jobstate.services``."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate import conf, stuck
from jobstate.admin import actions, bulk, dashboard, job_search, live, pauses, site, views
from jobstate.admin.changelist import JobChangeList, SafeListAdmin
from jobstate.admin.filters import KindFilter, OriginFilter, OwnerFilter, StatusFilter, StuckFilter
from jobstate.admin.inlines import AssetInline, JobEventInline, JobStepInline
from jobstate.admin.job_columns import JobColumns
from jobstate.admin.job_page import JobPageFields
from jobstate.admin.paginator import CappedPaginator
from jobstate.models import Job
from jobstate.models.job import may_view_all
from jobstate.states import ACTIVE, TERMINAL
from jobstate.worker.retention_holds import active_ancestors, holding_retries

# The request attribute ``has_delete_permission`` lists the jobs Django's delete
# summary asks about under (``get_deleted_objects``).
COLLECTED = "_jobstate_delete_collected"

# Counts shown on buttons and tiles stop here ("100+"): a glance, not a census.
BADGE_CAP = 100

# Heavy columns the list never shows.
LIST_DEFERRED = ("parameters", "result", "traceback", "error_message")


@admin.register(Job)
class JobAdmin(SafeListAdmin, JobColumns, JobPageFields, admin.ModelAdmin):
    list_display = (
        "short_id",
        "status_col",
        "kind",
        "owner_col",
        "progress_col",
        "attempts_col",
        "age_col",
        "created_col",
    )
    list_display_links = ("short_id",)
    list_filter = (
        StatusFilter,
        OriginFilter,
        KindFilter,
        OwnerFilter,
        StuckFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    list_select_related = ("owner",)
    list_per_page = 50
    list_max_show_all = 200
    search_fields = ("key",)  # the search itself is get_search_results
    search_help_text = (
        "A job id, its short id (its last 8 characters, as the list shows them) or its first "
        "characters, an idempotency key, or an owner's user name."
    )
    date_hierarchy = "created_at"
    extra_lookups = ("parent__id__exact",)  # the job page's link to its child jobs
    ordering = ("-created_at",)
    sortable_by = ("created_col",)  # the one ordering with an index behind it
    paginator = CappedPaginator
    changelist_class = JobChangeList
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = (bulk.cancel_selected, bulk.retry_selected, bulk.requeue_selected)
    inlines = (JobEventInline, JobStepInline, AssetInline)

    class Media:
        css = {"all": ("jobstate/admin.css",)}

    def __init__(self, model: Any, admin_site: Any) -> None:
        super().__init__(model, admin_site)
        site.install(admin_site)  # the dashboard and stuck page in the app list

    # --- permissions: the form never writes a job ------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued through jobstate.services

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # state changes go through the operation buttons below

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        collected: list[Job] | None = request.__dict__.get(COLLECTED)
        if collected is not None and obj is not None:
            collected.append(obj)  # get_deleted_objects: a job the cascade takes
        if obj is not None and not obj.is_terminal:
            return False  # never pull a running job from under its worker
        # The delete page names the job and all below it: those who may view jobs only.
        return may_view_all(request.user) and super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, set[str], list[Any]]:
        """Django's summary of a delete, each active job below the deleted ones listed
        as protected: the cascade would pull it from under its worker. Django's page then
        names those jobs ("would require deleting the following protected related
        objects") and a POST deletes nothing, instead of reading as a missing
        permission (``has_delete_permission`` refuses each of them). So is each job
        the delete would take that an active retry holds, with that retry
        (``retention_holds.holding_retries``): retention keeps it for the running chain,
        whose ``retry_of`` the delete would empty. And so is each deleted job with an
        active job above it, with the nearest such job (``retention_holds.active_ancestors``):
        retention keeps it, as a retried child workflow of that job reuses its completed
        children.

        The jobs below are those Django's collector loaded (``parent`` cascades), each
        of which its summary passes to ``has_delete_permission``: read there, not
        walked again."""
        collected: list[Job] = []
        request.__dict__[COLLECTED] = collected
        try:
            to_delete, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        finally:
            del request.__dict__[COLLECTED]
        roots = {job.pk: job for job in objs}
        below = {job.pk: job for job in collected if job.pk not in roots}
        active = sorted(
            (job for job in below.values() if job.status not in TERMINAL), key=lambda j: str(j.pk)
        )
        jobs = {**below, **roots}
        using = router.db_for_write(Job)
        held = holding_retries(list(roots), list(below), using)
        above = active_ancestors(list(roots), using)
        refused = [
            *(self._still_active(job) for job in active),
            *(self._held(jobs[pk], retry) for pk, retry in held),
            *(self._below_active(roots[pk], ancestor) for pk, ancestor in above),
        ]
        if refused:
            protected = [*protected, *refused]
            if super().has_delete_permission(request):  # refused only for these reasons
                perms_needed.discard(self.opts.verbose_name)
        return to_delete, model_count, perms_needed, protected

    def _link(self, job: Job) -> SafeString:
        url = reverse(f"{self.admin_site.name}:jobstate_job_change", args=[job.pk])
        return format_html('<a href="{}">{}</a>', url, job)

    def _still_active(self, job: Job) -> SafeString:
        return format_html("Job: {}, still active", self._link(job))

    def _held(self, job: Job, retry: Job) -> SafeString:
        return format_html("Job: {}, held by the active retry {}", self._link(job), self._link(retry))

    def _below_active(self, job: Job, ancestor: Job) -> SafeString:
        return format_html("Job: {}, below the active job {}", self._link(job), self._link(ancestor))

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("jobstate.cancel_job"))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("jobstate.retry_job"))

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("jobstate.requeue_job"))

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # ``action_location`` exists from Django 6.1 on (actions on the change form).
        if action_location is None:
            found = super().get_actions(request)
        else:
            found = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg]
        found.pop("delete_selected", None)  # it would delete active jobs in bulk
        return found

    @staticmethod
    def count_cap() -> int:
        return int(conf.get("ADMIN_COUNT_CAP"))

    # --- the list -------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        qs = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "jobstate_job_changelist":
            qs = qs.defer(*LIST_DEFERRED)
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return job_search.search(queryset, term, lambda: self._short_ids(request, queryset.db, term)), False

    def _short_ids(self, request: HttpRequest, db: str, term: str) -> list[uuid.UUID]:
        """``job_search.short_id_matches`` over the whole table, once per request: a bulk
        action's POST searches twice (Django's changelist builds its queryset, then
        the action's), and the caller's queryset narrows the ids down each time."""
        memo: dict[tuple[str, str], list[uuid.UUID]] = request.__dict__.setdefault("_jobstate_short_ids", {})
        if (db, term) not in memo:
            memo[db, term] = job_search.short_id_matches(self.model._default_manager.using(db), term)
        return memo[db, term]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if request.method == "POST" and bulk.posted_action_refused(self, request):
            raise PermissionDenied
        # A glance for the "Stuck jobs" button: each reason counted up to BADGE_CAP
        # (one past it, so that "100+" says more than 100).
        # One stuck-detection context for the counts and the rows (job_columns.share_stuck_context).
        ctx = request._jobstate_stuck_ctx = stuck.Context()  # type: ignore[attr-defined]
        counts = stuck.count_stuck(codes=stuck.ACTIVE_REASONS, cap=BADGE_CAP + 1, ctx=ctx)
        extra = {
            "stuck_count": sum(min(BADGE_CAP, n) for n in counts.values()),
            "stuck_count_capped": any(n > BADGE_CAP for n in counts.values()),
            **(extra_context or {}),
        }
        if request.method != "GET" or "stuck" not in request.GET:
            return super().changelist_view(request, extra)
        # The capped count of a stuck filter is planned as costly (its reasons are
        # OR-ed) but runs in milliseconds; the JIT compiler would take longer.
        with stuck.no_jit(self.get_queryset(request).db):
            response = super().changelist_view(request, extra)
            if isinstance(response, TemplateResponse):
                response.render()  # its queries (e.g. the date hierarchy's) inside too
            return response

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        """Loaded once per request: ``change_view`` reads the job before Django's form
        view reads it again."""
        memo: dict[tuple[str, str | None], Job | None] = request.__dict__.setdefault("_jobstate_jobs", {})
        if (object_id, from_field) not in memo:
            memo[object_id, from_field] = super().get_object(request, object_id, from_field)
        return memo[object_id, from_field]

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        if obj is None:
            return []
        inlines: list[Any] = [JobEventInline]
        if obj.steps.exists():
            inlines.append(JobStepInline)
        if obj.assets.exists():  # an empty table says nothing
            inlines.append(AssetInline)
        return inlines

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        job = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if job is not None:
            extra["operations"] = actions.available(job, request.user)
            extra["finding"] = stuck.check(job)
            extra["live_active"] = job.status in ACTIVE
            # Not str(job), which ends with its status: the live refresh updates the
            # badge, and a heading saying "[processing]" went stale beside it.
            extra["subtitle"] = f"{job.kind} {job.pk}"
        return super().change_view(request, object_id, form_url, extra)

    # --- extra pages ------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view

        def bind(view: Any) -> Any:
            def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                response: HttpResponse = view(self, request, *args, **kwargs)
                return response

            return wrap(bound)

        return [
            path("dashboard/", bind(dashboard.dashboard_view), name="jobstate_job_dashboard"),
            path("stuck/", bind(views.stuck_view), name="jobstate_job_stuck"),
            path("live/", bind(live.live_view), name="jobstate_job_live"),
            path("stuck/remedy/", bind(views.stuck_remedy_view), name="jobstate_job_stuck_remedy"),
            path("stuck/reap/", bind(views.reap_view), name="jobstate_job_reap"),
            path("kinds/pause/", bind(pauses.pause_view), name="jobstate_job_pause_kind"),
            path("kinds/resume/", bind(pauses.resume_view), name="jobstate_job_resume_kind"),
            path(
                "<uuid:object_id>/act/<slug:name>/",
                bind(views.transition_view),
                name="jobstate_job_transition",
            ),
            *super().get_urls(),
        ]
