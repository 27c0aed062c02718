"""Pausing and resuming a kind from the admin: the dashboard's panel of paused kinds
with their Resume buttons, the Pause links of its per-kind table, the confirmation
page both go through (a reason asked, POST with CSRF), and the read-only list of
every pause kept (``KindPause``, the audit trail)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from jobstate import services
from jobstate.admin import display
from jobstate.admin.views import page_context
from jobstate.exceptions import PauseRefused, UnknownKind
from jobstate.models import KindPause
from jobstate.models.job import may_view_all
from jobstate.services import Actor
from jobstate.services.pauses import already_paused, describe, queued_counts
from jobstate.storable import text


class KindReasonForm(forms.Form):
    kind = forms.CharField(max_length=200, widget=forms.HiddenInput)
    reason = forms.CharField(
        label="Reason",
        required=False,
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "autofocus": True}),
        help_text="Kept in the pause's record with your user name.",
    )

    def __init__(self, *args: Any, reason_required: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reason_required = reason_required
        if not reason_required:
            self.fields["reason"].help_text += " Optional."

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"].strip()
        if self.reason_required and not reason:
            raise forms.ValidationError("Give a reason.")
        return reason


def may_pause(model_admin: Any, request: HttpRequest) -> bool:
    """Pausing or resuming a kind changes what every worker claims: staff who may
    view jobs and change them."""
    return bool(model_admin.has_view_permission(request)) and request.user.has_perm("jobstate.change_job")


def dashboard_context(model_admin: Any, request: HttpRequest) -> dict[str, Any]:
    """The dashboard's paused kinds (who, since when, why, how many queued) and
    whether this user may pause or resume one."""
    pauses = services.paused_kinds()
    counts = queued_counts([p.kind for p in pauses])
    return {
        # The list's compact time: the full one pushed the Resume buttons out of the panel.
        "paused": [
            {"pause": p, "queued": counts[p.kind], "since": display.compact_time(p.paused_at)} for p in pauses
        ],
        "paused_kinds": {p.kind for p in pauses},
        "may_pause": may_pause(model_admin, request),
    }


def pause_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    return _confirm(model_admin, request, resume=False)


def resume_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    return _confirm(model_admin, request, resume=True)


def _confirm(model_admin: Any, request: HttpRequest, *, resume: bool) -> HttpResponse:
    """GET (``?kind=``): the confirmation page asking for a reason. POST: pause or
    resume the kind, then back to the dashboard with what happened."""
    if not may_pause(model_admin, request):
        raise PermissionDenied
    verb = "Resume" if resume else "Pause"
    data = request.POST if request.method == "POST" else None
    form = KindReasonForm(data, initial={"kind": request.GET.get("kind", "")}, reason_required=not resume)
    if data is not None and form.is_valid():
        kind, reason = form.cleaned_data["kind"], form.cleaned_data["reason"]
        try:
            if resume:
                services.resume_kind(kind, Actor.admin(request.user), reason)
                messages.success(request, f"Resumed {kind}: its queued jobs are claimed again.")
            else:
                services.pause_kind(kind, Actor.admin(request.user), reason)
                messages.success(request, f"Paused {kind}: no worker claims its jobs until it is resumed.")
        except PauseRefused as exc:
            messages.error(request, f"{verb} refused: {exc.refusal}")
        except UnknownKind:
            messages.error(request, f"{verb} refused: no kind '{kind}' is registered or has jobs.")
        return HttpResponseRedirect(reverse("admin:jobstate_job_dashboard"))
    # As the services take it: a NUL (which PostgreSQL refuses in a query) names no kind.
    kind = text(form["kind"].value() or "")
    pause = services.pauses.active_pause(kind) if kind else None
    return TemplateResponse(
        request,
        "admin/jobstate/job/kind_pause_confirm.html",
        page_context(
            model_admin,
            request,
            f"{verb} {kind}?",
            form=form,
            kind=kind,
            resume=resume,
            verb=verb,
            crumb=f"{verb} a kind",
            pause_text=_sentence(describe(pause)) if pause is not None else "",
            queued=queued_counts([kind])[kind] if kind else 0,
            refusal=_refusal(kind, pause, resume),
        ),
    )


def _refusal(kind: str, pause: KindPause | None, resume: bool) -> str:
    """Why the confirmation would be refused (the page then offers only the way
    back), as the services would say it; empty when it would not be."""
    if not kind:
        return "No kind given."
    if resume:
        return "" if pause is not None else f"'{kind}' is not paused."
    if pause is not None:
        return already_paused(pause) + "."
    if not services.pauses.may_be_paused(kind):
        return f"No kind '{kind}' is registered or has jobs."
    return ""


@admin.register(KindPause)
class KindPauseAdmin(admin.ModelAdmin):
    """Every pause, active or resumed: who, when, why. Written by the services only."""

    list_display = (
        "kind",
        "state",
        "paused_at",
        "paused_by_display",
        "reason",
        "resumed_at",
        "resumed_display",
    )
    list_filter = ("kind",)
    search_fields = ("kind",)
    list_select_related = ("paused_by", "resumed_by")
    actions = None

    def get_queryset(self, request: HttpRequest) -> QuerySet[KindPause]:
        return super().get_queryset(request).select_related("paused_by", "resumed_by")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_view_all(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="state")
    def state(self, obj: KindPause) -> SafeString:
        if obj.active:
            url = f"{reverse('admin:jobstate_job_resume_kind')}?{urlencode({'kind': obj.kind})}"
            return format_html('<strong>paused</strong> (<a href="{}">resume</a>)', url)
        return format_html("{}", "resumed")

    @admin.display(description="paused by")
    def paused_by_display(self, obj: KindPause) -> str:
        return obj.paused_by_text

    @admin.display(description="resumed by")
    def resumed_display(self, obj: KindPause) -> str:
        if obj.active:
            return "-"
        return obj.resumed_by_text + (f": {obj.resume_reason}" if obj.resume_reason else "")


def _sentence(text: str) -> str:
    """``text`` ended by a full stop, unless its reason ended it already ("down.")."""
    return text if text.endswith((".", "!", "?")) else f"{text}."
