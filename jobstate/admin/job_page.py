"""The job page's read-only fields: layout and display methods."""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from jobstate.admin import display
from jobstate.admin.views import job_url
from jobstate.models import Job


class JobPageFields:
    """Fieldsets and display methods of the (read-only) job page, mixed into ``JobAdmin``."""

    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("id_display", "status_display"),
                    ("kind", "owner"),
                    "progress_display",
                    ("current_step", "attempts_display", "priority"),
                    ("key", "input_watermark", "last_success_watermark"),
                    "relations",
                )
            },
        ),
        (
            "Timing",
            {"fields": (("created_at", "run_after"), ("started_at", "finished_at"), "duration_display")},
        ),
        (
            "Lease",
            {
                "fields": (
                    ("worker_id", "lease_expires_display", "heartbeat_display"),
                    ("cancel_requested_at", "stop_requested_at"),
                    "lease_token",
                ),
                "classes": ("js-lease",),
            },
        ),
        ("Parameters", {"fields": ("parameters_display",)}),
        ("Result", {"fields": ("result_display",)}),
        ("Error", {"fields": (("error_type", "error_message_display"), "traceback_display")}),
    )
    readonly_fields = (
        "id_display",
        "status_display",
        "kind",
        "owner",
        "progress_display",
        "current_step",
        "attempts_display",
        "priority",
        "key",
        "input_watermark",
        "last_success_watermark",
        "relations",
        "created_at",
        "run_after",
        "started_at",
        "finished_at",
        "duration_display",
        "worker_id",
        "lease_expires_display",
        "heartbeat_display",
        "cancel_requested_at",
        "stop_requested_at",
        "lease_token",
        "parameters_display",
        "result_display",
        "error_type",
        "error_message_display",
        "traceback_display",
    )

    @admin.display(description="id")
    def id_display(self, obj: Job) -> SafeString:
        return format_html("<code>{}</code>", obj.pk)

    @admin.display(description="status")
    def status_display(self, obj: Job) -> SafeString:
        return display.status_badge(obj.status)

    @admin.display(description="progress")
    def progress_display(self, obj: Job) -> SafeString:
        bar = display.progress_bar(obj.progress, obj.progress_message, obj.status)
        return format_html('{}<span class="js-progress-message">{}</span>', bar, obj.progress_message)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts} of {obj.max_attempts}"

    @admin.display(description="run time")
    def duration_display(self, obj: Job) -> str:
        if obj.started_at is None:
            return "never started"
        suffix = "" if obj.finished_at else " (running)"
        return display.short_duration(obj.duration) + suffix

    @admin.display(description="lease expires")
    def lease_expires_display(self, obj: Job) -> SafeString:
        return _relative(obj.lease_expires_at, "expired")

    @admin.display(description="last heartbeat")
    def heartbeat_display(self, obj: Job) -> SafeString:
        return _relative(obj.heartbeat_at, "")

    @admin.display(description="parameters")
    def parameters_display(self, obj: Job) -> SafeString:
        return display.pretty_json(obj.parameters)

    @admin.display(description="result")
    def result_display(self, obj: Job) -> SafeString:
        return display.pretty_json(obj.result)

    @admin.display(description="error message")
    def error_message_display(self, obj: Job) -> SafeString:
        return display.pre(obj.error_message)

    @admin.display(description="traceback")
    def traceback_display(self, obj: Job) -> SafeString:
        return display.pre(obj.traceback)

    @admin.display(description="related jobs")
    def relations(self, obj: Job) -> SafeString:
        links: list[tuple[str, str, str]] = []
        if obj.parent_id:
            links.append(("parent", job_url(obj.parent_id), str(obj.parent_id)[:8]))
        if obj.retry_of_id:
            links.append(("retry of", job_url(obj.retry_of_id), str(obj.retry_of_id)[:8]))
        for pk in Job.objects.filter(retry_of=obj.pk).order_by("created_at").values_list("pk", flat=True)[:5]:
            links.append(("retried as", job_url(pk), str(pk)[:8]))
        changelist = reverse("admin:jobstate_job_changelist")
        children = Job.objects.filter(parent=obj.pk).order_by()[:1001].count()
        parts = format_html_join(" · ", '{} <a href="{}"><code>{}</code></a>', links)
        if children:
            label = "1000+" if children > 1000 else str(children)
            child_link = format_html(
                '<a href="{}?parent__id__exact={}">{} child job{}</a>',
                changelist,
                obj.pk,
                label,
                "" if children == 1 else "s",
            )
            parts = format_html("{}{}{}", parts, " · " if links else "", child_link)
        return parts or format_html("{}", "—")


def _relative(moment: datetime | None, past_word: str) -> SafeString:
    if moment is None:
        return format_html("{}", "-")
    now = timezone.now()
    stamp = timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
    if moment < now:
        word = f"{past_word} " if past_word else ""
        css = "js-late" if past_word else "js-muted"
        return format_html(
            '{} <span class="{}">({}{} ago)</span>', stamp, css, word, display.since(moment, now)
        )
    return format_html(
        '{} <span class="js-muted">(in {})</span>', stamp, display.short_duration(moment - now)
    )
