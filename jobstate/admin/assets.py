"""The Asset admin: browse files by type and job, download them as staff."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate.admin import display
from jobstate.admin.changelist import SafeListAdmin
from jobstate.admin.filters import JobIdFilter
from jobstate.admin.inlines import attempt_label, download_link
from jobstate.admin.jobs import LIST_DEFERRED
from jobstate.admin.paginator import CappedPaginator
from jobstate.exceptions import RangeNotSatisfiable, UnservableFile
from jobstate.ids import short
from jobstate.models import Asset
from jobstate.models.job import may_view_all
from jobstate.services import file_response
from jobstate.stuck import distinct_values


class AssetTypeFilter(admin.SimpleListFilter):
    title = "type"
    parameter_name = "type"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(t, t) for t in distinct_values(Asset, "asset_type", 100)]

    def queryset(self, request: Any, queryset: QuerySet[Asset]) -> QuerySet[Asset]:
        value = self.value()
        return queryset if value is None else queryset.filter(asset_type=value)


class AttemptFilter(admin.SimpleListFilter):
    """The jobs' results (what the API lists: ``Asset.objects.visible()``), or the files
    of lost attempts (what an operator cleaning storage looks for): by the asset's own
    ``attempt_lost`` flag, which the *attempt* column's "N, lost" shows, so no join."""

    title = "attempt"
    parameter_name = "attempt"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("results", "Results"), ("lost", "Lost attempts")]

    def queryset(self, request: Any, queryset: QuerySet[Asset]) -> QuerySet[Asset]:
        value = self.value()
        if value is None:
            return queryset
        if value not in ("results", "lost"):
            raise IncorrectLookupParameters(f"Unknown attempt filter '{value}'")
        return queryset.filter(attempt_lost=value == "lost")


class AssetJobFilter(JobIdFilter):
    """Assets of one job (reached from the job page)."""


@admin.register(Asset)
class AssetAdmin(SafeListAdmin, admin.ModelAdmin):
    # The download beside the name: last, it was cut off at 1440 px. The content type
    # (the asset type says much the same) is on the asset's page.
    list_display = (
        "name",
        "download",
        "asset_type",
        "size_display",
        "job_link",
        "owner",
        "created_column",
        "attempt_display",
    )
    list_filter = (
        AssetTypeFilter,
        AttemptFilter,
        AssetJobFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    list_select_related = ("job", "owner")
    search_fields = ()
    ordering = ("-created_at",)
    sortable_by = ("created_column",)
    list_per_page = 50
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "name",
        "asset_type",
        "job_link",
        "owner",
        "size_display",
        "content_type",
        "sha256",
        "storage_path",
        "url",
        "metadata_display",
        "created_at",
        "attempt_display",
        "download",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Asset]:
        # The job is joined for its kind: not its heavy columns (as the job list).
        return super().get_queryset(request).defer(*(f"job__{f}" for f in LIST_DEFERRED))

    # Visible to whoever may view jobs, as on the job page (download links included,
    # and a link here for the rest), and only to them, as the transition history: a file
    # is a job's output and may hold its owner's data, so ``view_asset`` (or
    # ``change_asset``) alone shows nothing, as in the API (``visible_assets``).

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_view_all(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # assets are added by jobs, through jobstate.services.add_asset

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Django's delete page asks for the delete permission alone (not view or
        # change), and it names the asset: ``delete_asset`` needs the job view
        # permission too, as the list and the asset's page do.
        return may_view_all(request.user) and super().has_delete_permission(request, obj)

    @admin.display(description="size", ordering="size")
    def size_display(self, obj: Asset) -> str:
        return display.file_size(obj.size) if obj.file else "-"

    @admin.display(description="created", ordering="created_at")
    def created_column(self, obj: Asset) -> SafeString:
        return display.compact_time(obj.created_at)

    @admin.display(description="job")
    def job_link(self, obj: Asset) -> SafeString:
        url = reverse("admin:jobstate_job_change", args=[obj.job_id])
        return format_html('<a href="{}">{} <code>{}</code></a>', url, obj.job.kind, short(obj.job_id))

    @admin.display(description="attempt")
    def attempt_display(self, obj: Asset) -> SafeString:
        return attempt_label(obj)

    @admin.display(description="metadata")
    def metadata_display(self, obj: Asset) -> SafeString:
        return display.pretty_json(obj.metadata)

    @admin.display(description="download")
    def download(self, obj: Asset) -> SafeString:
        return download_link(obj)

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<uuid:asset_id>/download/",
                self.admin_site.admin_view(self.download_view),
                name="jobstate_asset_download",
            ),
            *super().get_urls(),
        ]

    def download_view(self, request: HttpRequest, asset_id: Any) -> FileResponse | HttpResponse:
        """Stream a stored file to staff who may view jobs (or to its owner). Anyone else gets
        the 404 of an asset that does not exist, as from the API: a 403 said it did."""
        user = request.user
        # may_view_all: the job page's rule for showing the download link.
        if self.has_view_permission(request):
            assets = Asset.objects.all()
        else:  # their own, as the API shows them (jobstate.api.permissions.visible_assets)
            assets = Asset.objects.visible().filter(owner_id=user.pk)
        asset = get_object_or_404(assets, pk=asset_id)
        if not asset.file:
            raise Http404("This asset has no stored file.")
        try:
            return file_response(asset, request)
        except OSError:
            raise Http404("The stored file is missing.") from None
        except UnservableFile as exc:  # logged by file_response
            raise Http404(str(exc)) from None
        except RangeNotSatisfiable as exc:
            headers = {"Content-Range": exc.content_range}
            return HttpResponse(
                str(exc), status=416, content_type="text/plain; charset=utf-8", headers=headers
            )
