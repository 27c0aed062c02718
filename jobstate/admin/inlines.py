"""Read-only inlines on the job page: history, workflow steps, assets.

A job may have thousands of transitions or assets: those inlines show the
latest ``limit`` rows and link to the full list, filtered by the job. The assets
list the job's results first, then the files of lost attempts, marked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import F
from django.forms.models import BaseInlineFormSet
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from jobstate.admin import display
from jobstate.models import Asset, JobEvent, JobStep
from jobstate.models.step import SHOWN_STEP_STATUS, shown_status


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        # Part of the job: whoever may view the job sees its history, steps and files.
        return bool(
            request.user.has_perm("jobstate.view_job") or request.user.has_perm("jobstate.change_job")
        )

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        return list(cast("Sequence[str]", self.fields or []))  # names: these inlines group no fields


class CappedInlineFormSet(BaseInlineFormSet):
    """The latest ``limit`` rows of the inline's ordering, still in that order
    (its first rows when the ordering puts the newest first: ``newest_first``)."""

    limit = 50
    # The total is counted up to here: a global webhook endpoint's deliveries grow
    # without bound, and an uncapped COUNT read every one on each page view.
    count_cap = 10_000
    newest_first = False
    full_list_url = ""
    noun: str  # (these two set by CappedInline.get_formset)
    parent_noun: str

    def get_queryset(self) -> Any:
        if not hasattr(self, "_capped"):
            qs = super().get_queryset()
            newest = list((qs if self.newest_first else qs.reverse())[: self.limit + 1])
            self.truncated = len(newest) > self.limit
            rows = newest[: self.limit] if self.newest_first else newest[: self.limit][::-1]
            self.total = qs.order_by()[: self.count_cap + 1].count() if self.truncated else len(rows)
            over = self.total > self.count_cap
            self.total_label = f"more than {self.count_cap:,}" if over else f"{self.total:,}"
            self._capped = rows
        return self._capped


class CappedInline(ReadOnlyInline):
    formset = CappedInlineFormSet
    template = "admin/jobstate/job/capped_tabular.html"
    limit = 50
    count_cap = 10_000
    newest_first = False  # the inline's ordering puts the newest rows first
    noun = "rows"
    parent_noun = "job"
    full_list = ""  # admin URL name of the list that the ``full_list_param`` filter narrows
    full_list_param = "job"

    def get_formset(self, request: Any, obj: Any = None, **kwargs: Any) -> Any:
        formset = cast("type[CappedInlineFormSet]", super().get_formset(request, obj, **kwargs))
        formset.limit = self.limit
        formset.count_cap = self.count_cap
        formset.newest_first = self.newest_first
        formset.noun = self.noun
        formset.parent_noun = self.parent_noun
        formset.full_list_url = self.full_list_url(obj)
        return formset

    def full_list_url(self, parent: Any) -> str:
        if parent is None or not self.full_list:
            return ""
        try:
            return f"{reverse(self.full_list)}?{urlencode({self.full_list_param: parent.pk})}"
        except NoReverseMatch:  # that ModelAdmin is not registered
            return ""


def _compact(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= 160 else text[:157] + "…"


class EventColumns:
    """How a transition is shown, on the job page and in the full history list."""

    @admin.display(description="time")
    def when(self, obj: JobEvent) -> str:
        return display.exact_time(obj.created_at)

    @admin.display(description="from → to")
    def change(self, obj: JobEvent) -> SafeString:
        start = display.status_badge(obj.from_status) if obj.from_status else format_html("{}", "∅")
        return format_html("{} → {}", start, display.status_badge(obj.to_status))

    @admin.display(description="actor")
    def actor_display(self, obj: JobEvent) -> SafeString:
        user = obj.actor_user
        if user is None:
            return format_html("{}", obj.actor_text)
        return format_html("{} <span class='js-muted'>({})</span>", obj.actor_label, user)

    @admin.display(description="reason")
    def reason_display(self, obj: JobEvent) -> str:
        return obj.reason or ""

    @admin.display(description="details")
    def details(self, obj: JobEvent) -> SafeString:
        meta = dict(obj.metadata or {})
        trace = meta.pop("traceback", "")
        out = format_html('<code class="js-meta">{}</code>', _compact(meta)) if meta else mark_safe("")
        if trace:
            out = format_html(
                '{}<details><summary>traceback</summary><pre class="js-pre">{}</pre></details>', out, trace
            )
        return out


STEP_LABELS: dict[str, str] = {str(value): str(label) for value, label in SHOWN_STEP_STATUS}


class JobStepInline(ReadOnlyInline):
    model = JobStep
    verbose_name = "step"
    verbose_name_plural = "Workflow steps"
    fields = (
        "position",
        "name",
        "step_status",
        "attempts",
        "cursor_display",
        "output_display",
        "error_message",
    )
    classes = ("js-steps",)

    def get_queryset(self, request: Any) -> Any:
        # The job's status, for each step's shown status, in the same query.
        return super().get_queryset(request).annotate(job_status=F("job__status"))

    @admin.display(description="status")
    def step_status(self, obj: JobStep) -> str:
        """As ``jobstate.workflows.state`` shows it: "Interrupted (was running)" for a
        step still in progress when its job ended."""
        job_status = getattr(obj, "job_status", None) or obj.job.status
        shown = shown_status(obj.status, job_status)
        if shown == obj.status:
            return STEP_LABELS.get(shown, shown)
        return f"{STEP_LABELS[shown]} (was {STEP_LABELS.get(obj.status, obj.status).lower()})"

    @admin.display(description="cursor")
    def cursor_display(self, obj: JobStep) -> SafeString:
        return format_html('<code class="js-meta">{}</code>', _compact(obj.cursor))

    @admin.display(description="output")
    def output_display(self, obj: JobStep) -> SafeString:
        return format_html('<code class="js-meta">{}</code>', _compact(obj.output))


class JobEventInline(EventColumns, CappedInline):
    model = JobEvent
    verbose_name = "transition"
    verbose_name_plural = "Transition history"
    fields = ("when", "change", "transition", "actor_display", "reason_display", "details")
    classes = ("js-history",)
    noun = "transitions"
    full_list = "admin:jobstate_jobevent_changelist"

    def get_queryset(self, request: Any) -> Any:
        # Insertion order is the truth (JobEvent.Meta), whatever the clocks said.
        return super().get_queryset(request).select_related("actor").order_by("id")


class ResultsFirstFormSet(CappedInlineFormSet):
    """The latest assets, the job's results (``services.result_assets``) first, then
    those of lost attempts, which the API and ``jobstate show`` leave out; each oldest first."""

    def get_queryset(self) -> Any:
        if not hasattr(self, "_results_first"):
            self._results_first = sorted(super().get_queryset(), key=lambda asset: asset.attempt_lost)
        return self._results_first


class AssetInline(CappedInline):
    model = Asset
    formset = ResultsFirstFormSet
    verbose_name = "asset"
    verbose_name_plural = "Assets"
    fields = (
        "name",
        "asset_type",
        "size_display",
        "content_type",
        "created_display",
        "attempt_display",
        "download",
    )
    classes = ("js-assets",)
    noun = "assets"
    full_list = "admin:jobstate_asset_changelist"

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).order_by("created_at", "id")

    @admin.display(description="size")
    def size_display(self, obj: Asset) -> str:
        return display.file_size(obj.size) if obj.file else "-"

    @admin.display(description="created at")
    def created_display(self, obj: Asset) -> str:
        return display.exact_time(obj.created_at)  # as the page's other times

    @admin.display(description="attempt")
    def attempt_display(self, obj: Asset) -> SafeString:
        return attempt_label(obj)

    @admin.display(description="download")
    def download(self, obj: Asset) -> SafeString:
        return download_link(obj)


LOST_HINT = (
    "Its worker died, or the attempt was taken from it (reaped, requeued or failed by an operator): "
    "not among the job's results, which the API and manage.py jobstate show list."
)


def attempt_label(asset: Asset) -> SafeString:
    """The attempt that stored ``asset`` ("-": not stored under a lease), "N, lost" when
    that attempt was lost (the row is muted, see admin.css)."""
    if asset.attempt is None:
        return format_html("{}", "-")
    if asset.attempt_lost:
        return format_html('<span class="js-lost" title="{}">{}, lost</span>', LOST_HINT, asset.attempt)
    return format_html("{}", asset.attempt)


def download_link(asset: Asset) -> SafeString:
    if asset.file:
        url = reverse("admin:jobstate_asset_download", args=[asset.pk])
        return format_html('<a class="js-download" href="{}">Download</a>', url)
    if asset.url.lower().startswith(("https://", "http://")):
        return format_html(
            '<a href="{}" rel="noopener noreferrer" target="_blank">External link</a>', asset.url
        )
    return format_html("{}", "-")
