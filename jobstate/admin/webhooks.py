"""The admin for webhook endpoints and their delivery attempts (in the admin
package, above ``jobstate.webhooks``, to share the safe change list)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from jobstate.admin import display, job_search, webhook_secret
from jobstate.admin.changelist import SafeListAdmin
from jobstate.admin.exact_times import ShownAs
from jobstate.admin.inlines import CappedInline
from jobstate.admin.paginator import CappedPaginator
from jobstate.admin.views import job_url
from jobstate.ids import short
from jobstate.models import Job
from jobstate.models.job import may_view_all
from jobstate.storable import MAX_DEPTH, text, too_deep
from jobstate.webhooks import answerable, cache, delivery, ownership, validation, visibility
from jobstate.webhooks.models import EVENTS, WebhookDelivery, WebhookEndpoint

# Deliveries to an inactive user's endpoints are skipped (``jobstate.webhooks.outbox``
# queues none, ``delivery`` ends the ones queued before): the admin says so.
INACTIVE_MARK = "owner inactive: nothing is delivered"

# A list cell's share of a long text (a reason, an error): the rest is on the row's page.
LIST_TEXT_CHARS = 60
ENDPOINT_CHARS = 28

# Set on an endpoint whose save gave it a new secret (a change of owner).
NEW_SECRET = "_jobstate_new_secret"


def owner_inactive(endpoint: WebhookEndpoint) -> bool:
    """As ``jobstate.webhooks.delivery`` judges it."""
    return endpoint.owner is not None and not getattr(endpoint.owner, "is_active", True)


class DeliveryInline(CappedInline):
    """The endpoint's latest deliveries (an endpoint makes one or more per job it
    hears about), with a link to all of them."""

    model = WebhookDelivery
    fields = ("created_display", "event", "webhook_id", "attempt", "ok", "status_code", "took", "error")
    show_change_link = True
    newest_first = True
    noun = "deliveries"
    parent_noun = "endpoint"
    full_list = "admin:jobstate_webhookdelivery_changelist"
    full_list_param = "endpoint__id__exact"

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        return admin.TabularInline.has_view_permission(self, request, obj)  # the model's own

    def get_queryset(self, request: HttpRequest) -> Any:
        # As the API's list: the endpoint may have been someone else's (``visibility``).
        return visibility.seen_by(super().get_queryset(request), request.user).order_by("-id")

    @admin.display(description="created at")
    def created_display(self, obj: WebhookDelivery) -> str:
        return display.exact_time(obj.created_at)

    @admin.display(description="took")
    def took(self, obj: WebhookDelivery) -> str:
        return delivery_took(obj)


def delivery_took(obj: WebhookDelivery) -> str:
    return display.short_duration(timedelta(milliseconds=obj.duration_ms))


def _https_by_default(field: models.Field[Any, Any], **kwargs: Any) -> forms.Field | None:
    if isinstance(field, models.URLField):
        kwargs["assume_scheme"] = "https"
    return field.formfield(**kwargs)


class _ShownJSON(forms.JSONField):
    """A JSON field whose refused value is shown again as UTF-8 can carry it: a lone
    surrogate (``"\\ud800"`` in the submitted JSON) made the page a 500. Text nested
    deeper than ``MAX_DEPTH`` is refused unparsed: ``json.loads`` ran out of stack on
    it (a 500), in the posted value, its redisplay and the page's initial value."""

    default_error_messages = {"too_deep": f"Nested more than {MAX_DEPTH} levels deep."}

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and too_deep(value):
            raise ValidationError(self.error_messages["too_deep"], code="too_deep")
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, str) and too_deep(data):
            return forms.fields.InvalidJSONInput(data)  # shown again as it was typed
        return super().bound_data(data, initial)

    def prepare_value(self, value: Any) -> Any:
        return text(super().prepare_value(value))


class WebhookEndpointForm(forms.ModelForm):
    """The API's rules (``jobstate.webhooks.validation``): the outbox reads these
    fields inside every job's transition."""

    class Meta:
        model = WebhookEndpoint
        fields = ("owner", "url", "description", "events", "kinds", "enabled")
        # As the admin's formfield_overrides, for the form on its own (Django 6's default).
        formfield_callback = staticmethod(_https_by_default)
        field_classes = {"events": _ShownJSON, "kinds": _ShownJSON}
        help_texts = {
            "owner": "Empty: a global endpoint that hears about every job (staff only). Given to "
            "another owner, it keeps its deliveries, but the new owner sees only those about their own "
            "jobs; its failure count starts again and it gets a new secret (the previous owner held "
            "the old one), shown once after the save.",
            "enabled": "Deliveries stop when an endpoint keeps failing (see the disabled reason). "
            "Tick it again, once the receiver works, to resume them and reset the failure count.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each field's value when the page was loaded goes with the form: what the editor
        # changed is judged against it (``changed_data``), not against the row as the save
        # reads it, which a delivery (an automatic disable) may have changed meanwhile.
        for field in self.fields.values():
            field.show_hidden_initial = True

    def clean_url(self) -> str:
        return validation.url(self.cleaned_data["url"])

    def clean_events(self) -> list[str]:
        return validation.events(self.cleaned_data["events"])

    def clean_kinds(self) -> list[str]:
        return validation.kinds(self.cleaned_data.get("kinds"))

    # Set by WebhookEndpointAdmin.get_form from the user who fills it in.
    sees_every_job = False
    editor_pk: Any = None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # As in the API: an endpoint hears about its owner's jobs (without an owner,
        # about every job), so only those who may see every job name another owner
        # or none.
        owner = cleaned.get("owner")
        if not owner and not self.sees_every_job:
            self.add_error(
                "owner",
                "An endpoint without an owner hears about every job: only staff who may view "
                "every job (jobstate.view_job) may make one. Name its owner.",
            )
        elif owner and owner.pk != self.editor_pk and not self.sees_every_job:
            self.add_error(
                "owner",
                "An endpoint hears about its owner's jobs: only staff who may view every job "
                "(jobstate.view_job) name another owner than themselves.",
            )
        return cleaned


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(SafeListAdmin, ShownAs, admin.ModelAdmin):
    exact_times = ("previous_secret_expires_at", "disabled_at", "created_at", "updated_at")
    show_facets = admin.ShowFacets.NEVER
    form = WebhookEndpointForm
    list_display = (
        "url",
        "owner_column",
        "enabled",
        "failures",
        "disabled_at_column",
        "reason",
    )
    list_select_related = ("owner", "answerable")
    list_filter = ("enabled",)
    search_fields = ("url", "description")  # and the owner's name: get_search_fields
    raw_id_fields = ("owner",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    # The secret itself never: shown once, as it is made (``webhook_secret``).
    readonly_fields = (
        "owner_state",
        "answerable",
        "signing_secret",
        *(f for f in WebhookEndpoint.SERVER_FIELDS if f != "secret"),
    )
    inlines = [DeliveryInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # jobstate's own fields have no value before the save (a made-up "created at")
            return ("signing_secret",)
        return super().get_readonly_fields(request, obj)

    @admin.display(description="failures", ordering="consecutive_failures")
    def failures(self, obj: WebhookEndpoint) -> int:
        return obj.consecutive_failures  # in a row (the field's name made a wide header)

    @admin.display(description="disabled at", ordering="disabled_at")
    def disabled_at_column(self, obj: WebhookEndpoint) -> SafeString:
        return display.compact_time(obj.disabled_at)

    @admin.display(description="disabled reason")
    def reason(self, obj: WebhookEndpoint) -> str:
        # The start, without how to re-enable (the field's help on its page says it): the
        # whole reason squeezed the column to a letter a line at 1440 px.
        reason = obj.disabled_reason.removesuffix(delivery.REENABLE).strip()
        return Truncator(reason).chars(LIST_TEXT_CHARS)

    @admin.display(description="owner", ordering="owner")
    def owner_column(self, obj: WebhookEndpoint) -> str:
        if obj.owner is None:
            return "global (every job)"
        if owner_inactive(obj):
            return format_html("{} <strong>({})</strong>", obj.owner, INACTIVE_MARK)
        return str(obj.owner)

    @admin.display(description="owner status")
    def owner_state(self, obj: WebhookEndpoint) -> str:
        if obj.pk is None:
            return "-"
        if obj.owner is None:
            return (
                "Global: hears about every job, whoever owns it, while the staff user who answers "
                "for it (who made it global or last changed it) may view every job. Once they may "
                "not (inactive, not staff, without jobstate.view_job, deleted) it is disabled at its "
                "next delivery; whoever enables it again answers for it then."
            )
        if owner_inactive(obj):
            return format_html(
                "<strong>{}.</strong> {} is inactive (is_active false): events of their jobs are dropped "
                "while they are, not queued for later, and deliveries queued before end without "
                "sending. New events are delivered again once the owner is active.",
                INACTIVE_MARK.capitalize(),
                obj.owner,
            )
        return "Active: their jobs' events are delivered."

    @admin.display(description="signing secret")
    def signing_secret(self, obj: WebhookEndpoint) -> str:
        if obj.pk is None:
            return "Made when the endpoint is saved, and shown once then."
        return (
            "Set. It is shown once, when it is made (the endpoint's creation, a rotation, a change of "
            "owner), and never again: whoever lost it rotates it (Rotate secret, above, for those who "
            "may change the endpoint)."
        )

    def get_urls(self) -> list[Any]:
        def bind(view: Any) -> Any:
            def bound(request: HttpRequest, object_id: str) -> HttpResponse:
                response: HttpResponse = view(self, request, object_id)
                return response

            return self.admin_site.admin_view(bound)

        return [
            path(
                "<path:object_id>/secret/",
                bind(webhook_secret.secret_view),
                name="jobstate_webhookendpoint_secret",
            ),
            path(
                "<path:object_id>/rotate-secret/",
                bind(webhook_secret.rotate_view),
                name="jobstate_webhookendpoint_rotate_secret",
            ),
            *super().get_urls(),
        ]

    def response_add(self, request: HttpRequest, obj: WebhookEndpoint, post_url_continue: Any = None) -> Any:
        # The new secret, this once, on its own page; then on to where the admin
        # would have gone (the list, the endpoint's page, another form).
        response = super().response_add(request, obj, post_url_continue)
        if IS_POPUP_VAR in request.POST or not isinstance(response, HttpResponseRedirect):
            return response
        return webhook_secret.show_once(request, obj, response.url)

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        # The user model's own name field: a custom one may have no ``username`` (a 500).
        return (*self.search_fields, f"owner__{get_user_model().USERNAME_FIELD}")

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookEndpoint]:
        # As in the API: without jobstate.view_job (or change_job), one's own endpoints only.
        qs = super().get_queryset(request)
        return qs if may_view_all(request.user) else qs.filter(owner=request.user.pk)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        form.sees_every_job = may_view_all(request.user)  # type: ignore[attr-defined]
        form.editor_pk = request.user.pk  # type: ignore[attr-defined]
        return form

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        # Django's, with the lock.
        queryset = self.get_queryset(request)
        if request.method == "POST" and transaction.get_connection(queryset.db).in_atomic_block:
            # A save: read under the row lock its write keeps, as the API does (a rotation
            # or a delivery's write waits for it; a deletion cannot come between them).
            queryset = queryset.select_for_update(of=("self",))
        model = queryset.model
        field: Any = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, Any, Any]:
        to_delete, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        if may_view_all(request.user):
            return to_delete, counts, perms_needed, protected
        # The confirmation listed each delivery (its event, webhook-id and attempt), those
        # about a previous owner's jobs too (``visibility``): the endpoints only, and the
        # deliveries counted in the summary.
        endpoints = [item for item in to_delete if not isinstance(item, list)]
        return endpoints, counts, perms_needed, protected

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        # The bulk action deletes a queryset, without the model's delete(), which
        # drops the process's cached wanted events.
        super().delete_queryset(request, queryset)
        cache.changed(queryset.db)

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        if not change:
            obj.answerable = answerable.for_editor(obj.owner, request.user)
            super().save_model(request, obj, form, change)
            return
        # Only what the editor changed since the page loaded: a full-row save undid a
        # rotation or an automatic disable (``enabled`` still ticked on the page) made
        # since then.
        fields = {name for name in form.changed_data if name in form._meta.fields}
        if fields:
            # A global endpoint is answered for by whoever last changed it (``answerable``).
            obj.answerable = answerable.for_editor(obj.owner, request.user)
            fields.add("answerable")
        if "owner" in fields:
            # Nothing of the previous owner's: failure count, reason, secret (``ownership``);
            # the new secret is shown once after the save (``response_change``).
            for name, value in ownership.handed_over(obj).items():
                setattr(obj, name, value)
                fields.add(name)
            setattr(obj, NEW_SECRET, True)
        if obj.enabled and "enabled" in fields:
            obj.consecutive_failures, obj.disabled_at, obj.disabled_reason = 0, None, ""
            fields |= {"consecutive_failures", "disabled_at", "disabled_reason"}
        obj.save(update_fields=sorted(fields | {"updated_at"}))

    def response_change(self, request: HttpRequest, obj: WebhookEndpoint) -> Any:
        # A change of owner made a new secret: shown this once, as after a rotation.
        response = super().response_change(request, obj)
        if not getattr(obj, NEW_SECRET, False):
            return response
        if IS_POPUP_VAR in request.POST or not isinstance(response, HttpResponseRedirect):
            return response
        return webhook_secret.show_once(request, obj, response.url)


class DeliveryEventFilter(admin.SimpleListFilter):
    """The event types an endpoint can hear (Django's field filter reads them with a
    ``SELECT DISTINCT`` over every delivery)."""

    title = "event"
    parameter_name = "event"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(e, e) for e in sorted(EVENTS)]

    def queryset(self, request: Any, queryset: QuerySet[WebhookDelivery]) -> QuerySet[WebhookDelivery]:
        value = self.value()
        return queryset if value is None else queryset.filter(event=value)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(SafeListAdmin, ShownAs, admin.ModelAdmin):
    # One row or more per job an endpoint hears about: counted as the job list is.
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    # What failed first, then about which job and to where (the endpoint's URL cut short). The
    # webhook-id is on the row's page (and the search takes it): the job, event and attempt tell
    # a row apart, and with it the list no longer fit a 1440 px window.
    list_display = (
        "created_column",
        "ok",
        "status_code_column",
        "error_column",
        "event",
        "job_column",
        "endpoint_column",
        "attempt",
        "duration_column",
    )
    list_filter = ("ok", DeliveryEventFilter)
    search_fields = ("webhook_id", "job_id")  # see get_search_results
    search_help_text = (
        "As the job list's search, the deliveries about the jobs it finds: a job id, its short id (its "
        "last 8 characters) or its first characters, an idempotency key, an owner's user name; or a "
        "webhook-id (msg_...), exactly."
    )
    extra_lookups = ("endpoint__id__exact",)  # the endpoint page's link to all its deliveries
    list_select_related = ("endpoint",)
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    exact_times = ("created_at",)
    shown_as = {"duration_ms": "duration_column"}

    @admin.display(description="created", ordering="created_at")
    def created_column(self, obj: WebhookDelivery) -> SafeString:
        return display.compact_time(obj.created_at)

    @admin.display(description="HTTP", ordering="status_code")
    def status_code_column(self, obj: WebhookDelivery) -> str:
        return "-" if obj.status_code is None else str(obj.status_code)

    @admin.display(description="error")
    def error_column(self, obj: WebhookDelivery) -> str:
        return Truncator(obj.error).chars(LIST_TEXT_CHARS) or "-"

    @admin.display(description="took", ordering="duration_ms")
    def duration_column(self, obj: WebhookDelivery) -> str:
        return delivery_took(obj)

    @admin.display(description="job")
    def job_column(self, obj: WebhookDelivery) -> SafeString:
        return format_html(
            '<a href="{}"><code title="{}">{}</code></a>', job_url(obj.job_id), obj.job_id, short(obj.job_id)
        )

    @admin.display(description="endpoint")
    def endpoint_column(self, obj: WebhookDelivery) -> SafeString:
        # Its host (and path, cut short); the whole URL on hover. Read with the row (list_select_related).
        url = obj.endpoint.url
        shown = Truncator(url.split("://", 1)[-1]).chars(ENDPOINT_CHARS)
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            reverse("admin:jobstate_webhookendpoint_change", args=[obj.endpoint_id]),
            url,
            shown,
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDelivery]:
        # As the endpoints: without jobstate.view_job (or change_job), those of one's own only.
        qs = super().get_queryset(request)
        if may_view_all(request.user):
            return qs
        # The endpoints' ids, not a join: with a join PostgreSQL walked every delivery
        # newest first to find the few of this user's endpoints.
        own = list(WebhookEndpoint.objects.filter(owner=request.user.pk).values_list("pk", flat=True))
        # And of those, the ones about their own jobs (an endpoint given to them keeps
        # its records of the previous owner's: ``visibility``).
        return visibility.seen_by(qs.filter(endpoint_id__in=own), request.user)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WebhookDelivery], search_term: str
    ) -> tuple[QuerySet[WebhookDelivery], bool]:
        # Exact values and id prefixes, each an index lookup (the default ``icontains``
        # read every delivery ever kept), as the job list's search finds jobs.
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.startswith("msg_"):
            return queryset.filter(webhook_id=term), False
        jobs = Job.objects.using(queryset.db)
        found = job_search.search(
            queryset, term, lambda: job_search.short_id_matches(jobs, term), field="job_id"
        )
        return found, False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
