"""The full transition history, one job at a time (the job page shows the
latest transitions and links here with ``?job=<id>``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate.admin.changelist import SafeListAdmin
from jobstate.admin.filters import JobIdFilter
from jobstate.admin.inlines import EventColumns
from jobstate.admin.paginator import CappedPaginator
from jobstate.ids import short
from jobstate.models import JobEvent
from jobstate.models.job import may_view_all


@admin.register(JobEvent)
class JobEventAdmin(EventColumns, SafeListAdmin, admin.ModelAdmin):
    list_display = ("when", "job_link", "change", "transition", "actor_display", "reason_display", "details")
    list_display_links = None
    list_filter = (JobIdFilter,)
    ordering = ("-id",)  # newest first; the (job, id) index serves one job's history
    sortable_by = ()
    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = None

    class Media:
        css = {"all": ("jobstate/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobEvent]:
        return super().get_queryset(request).select_related("actor")

    # Read-only, and visible to whoever may view jobs, as on the job page; only to them:
    # a row is part of its job (kind, reasons, actors, errors), so ``view_jobevent``
    # alone shows nothing.

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_view_all(request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return False  # reached from the job page, not listed on the admin index

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Rows go only with their job (the job admin decides which jobs may go);
        # Django asks this for every related row when a job is deleted.
        return bool(request.user.has_perm("jobstate.delete_job"))

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        raise PermissionDenied  # the history is append-only

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), "show_delete": False}
        )

    @admin.display(description="job")
    def job_link(self, obj: JobEvent) -> SafeString:
        url = reverse("admin:jobstate_job_change", args=[obj.job_id])
        return format_html('<a href="{}"><code>{}</code></a>', url, short(obj.job_id))
