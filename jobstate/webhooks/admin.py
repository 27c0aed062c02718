"""The admin for webhook endpoints and their delivery attempts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint


class DeliveryInline(admin.TabularInline):
    model = WebhookDelivery
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("-id",)
    fields = ("created_at", "event", "webhook_id", "attempt", "ok", "status_code", "duration_ms", "error")
    readonly_fields = fields
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).order_by("-id")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("url", "owner", "enabled", "consecutive_failures", "disabled_reason", "created_at")
    list_filter = ("enabled",)
    search_fields = ("url", "description", "owner__username")
    raw_id_fields = ("owner",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    readonly_fields = WebhookEndpoint.SERVER_FIELDS
    inlines = [DeliveryInline]

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        if change and obj.enabled and "enabled" in form.changed_data:
            obj.consecutive_failures, obj.disabled_at, obj.disabled_reason = 0, None, ""
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "endpoint",
        "event",
        "webhook_id",
        "attempt",
        "ok",
        "status_code",
        "duration_ms",
    )
    list_filter = ("ok", "event")
    search_fields = ("webhook_id", "job_id")
    list_select_related = ("endpoint",)
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
