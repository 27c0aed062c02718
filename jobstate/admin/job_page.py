"""The job page's read-only fields: layout and display methods."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from jobstate.admin import display, own_jobs
from jobstate.admin.views import job_url
from jobstate.ids import short
from jobstate.models import Job
from jobstate.states import ACTIVE, Status

TOKEN_SHOWN = 8  # characters of a running job's lease token the page shows
CHILDREN_SHOWN = 20  # child jobs listed on a parent's page (all of them: the filtered list)
# A parent's children, those that need a look first.
CHILD_ORDER = (
    Status.FAILED,
    Status.PARTIAL,
    Status.CANCELLED,
    Status.PROCESSING,
    Status.WAITING,
    Status.QUEUED,
    Status.COMPLETED,
)

if TYPE_CHECKING:  # a mixin of JobAdmin: checked as part of it
    from django.contrib.admin.options import _FieldOpts, _FieldsetSpec

    _JobAdmin = admin.ModelAdmin[Job]
else:
    _JobAdmin = object


class JobPageFields(_JobAdmin):
    """Fieldsets and display methods of the (read-only) job page, mixed into ``JobAdmin``."""

    # The summary first; the history (and steps, assets) right under it (see
    # change_form.html); then the sections that have something to show.
    summary_fields = (
        ("id_display", "status_display"),
        ("kind_display", "owner"),
        ("progress_display", "duration_display"),
        ("step_display", "attempts_display", "priority"),
        ("created_display", "started_display", "finished_display"),
    )

    def get_fieldsets(self, request: Any, obj: Job | None = None) -> _FieldsetSpec:
        if obj is None:
            return [(None, {"fields": self.summary_fields})]
        cached = getattr(obj, "_js_fieldsets", None)  # the admin asks several times a page
        if cached is None:
            cached = obj._js_fieldsets = self._fieldsets_for(obj)  # type: ignore[attr-defined]
        return list(cached)

    def _fieldsets_for(self, obj: Job) -> list[tuple[str | None, _FieldOpts]]:
        summary: list[Any] = list(self.summary_fields)
        if obj.worker_id:
            summary[3] = (*summary[3], "worker_id")
        if obj.status == Status.QUEUED and obj.run_after > obj.created_at + timedelta(seconds=1):
            summary.append("run_after_display")
        if obj.key or obj.input_watermark is not None or obj.last_success_watermark is not None:
            summary.append(("key", "input_watermark", "last_success_watermark"))
        if (
            obj.parent_id
            or obj.retry_of_id
            or Job.objects.filter(Q(retry_of=obj.pk) | Q(parent=obj.pk)).exists()
        ):
            summary.append("relations")
        sections: list[tuple[str | None, _FieldOpts]] = [(None, {"fields": summary})]
        if obj.error_type or obj.error_message or obj.traceback:
            title = "Error" if obj.is_terminal else "Last error"  # an earlier attempt's
            sections.append(
                (title, {"fields": (("error_type", "error_message_display"), "traceback_display")})
            )
        if obj.result not in (None, {}, []):
            sections.append(("Result", {"fields": ("result_display",)}))
        sections.append(("Parameters", {"fields": ("parameters_display",)}))
        requests = tuple(
            f"{f}_display" for f in ("cancel_requested_at", "stop_requested_at") if getattr(obj, f)
        )
        if (obj.status in ACTIVE and (obj.lease_expires_at or obj.heartbeat_at)) or requests:
            lease = ("lease_expires_display", "heartbeat_display", "lease_token_display")
            fields: list[Any] = [lease if obj.lease_token else lease[:2]]
            if requests:
                fields.append(requests)
            sections.append(("Lease", {"fields": fields, "classes": ("js-lease",)}))
        return sections

    readonly_fields = (
        "id_display",
        "status_display",
        "kind_display",
        "owner",
        "progress_display",
        "step_display",
        "attempts_display",
        "priority",
        "key",
        "input_watermark",
        "last_success_watermark",
        "relations",
        "created_display",
        "run_after_display",
        "started_display",
        "finished_display",
        "duration_display",
        "worker_id",
        "lease_expires_display",
        "heartbeat_display",
        "cancel_requested_at_display",
        "stop_requested_at_display",
        "lease_token_display",
        "parameters_display",
        "result_display",
        "error_type",
        "error_message_display",
        "traceback_display",
    )

    @admin.display(description="id")
    def id_display(self, obj: Job) -> SafeString:
        return format_html("<code>{}</code>", obj.pk)

    @admin.display(description="kind")
    def kind_display(self, obj: Job) -> str:
        return obj.kind

    @admin.display(description="status")
    def status_display(self, obj: Job) -> SafeString:
        return own_jobs.status_note(obj, display.status_badge(obj.status), full=True)

    @admin.display(description="progress")
    def progress_display(self, obj: Job) -> SafeString:
        bar = display.progress_bar(obj.progress, obj.progress_message, obj.status)
        return format_html('{}<span class="js-progress-message">{}</span>', bar, obj.progress_message)

    @admin.display(description="step")
    def step_display(self, obj: Job) -> SafeString:
        # A finished job keeps the step it was last in: not a current one, nor its last
        # step (a workflow failed in step 3 of 4 keeps step 3). Escaped
        # here: the live refresh sets it as HTML, and a handler's step is its own text.
        if not obj.current_step:
            return format_html("{}", "-")
        if obj.status in ACTIVE:
            return format_html("{}", obj.current_step)
        return format_html("{} (the last one run)", obj.current_step)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts} of {obj.max_attempts}"

    @admin.display(description="time")
    def duration_display(self, obj: Job) -> str:
        # started_at is the last claim's: a retried job's or a workflow's that waited for
        # its children ran for longer than that, and waited besides.
        if obj.started_at is None:  # the job list's words
            return "never ran" if obj.is_terminal else "not started yet"
        now = timezone.now()
        total = display.short_duration((obj.finished_at or now) - obj.created_at)
        if obj.status == Status.PROCESSING:
            return f"running {display.short_duration(obj.duration)} · {total} since created"
        if obj.finished_at is None:
            # Queued for a retry or waiting for its children: the row keeps when the last
            # run began, not when it ended.
            return f"last run began {display.since(obj.started_at, now)} ago · {total} since created"
        return f"last run {display.short_duration(obj.duration)} · {total} from created to finished"

    # The times as the history shows them (display.exact_time), not Django's to the minute.

    @admin.display(description="created at")
    def created_display(self, obj: Job) -> str:
        return display.exact_time(obj.created_at)

    # started_at is the last claim's: a job requeued for another attempt (or a workflow
    # resumed) has its latest run's start, not its first.
    @admin.display(description="last run started")
    def started_display(self, obj: Job) -> str:
        return display.exact_time(obj.started_at)

    @admin.display(description="finished at")
    def finished_display(self, obj: Job) -> str:
        return display.exact_time(obj.finished_at)

    @admin.display(description="run after")
    def run_after_display(self, obj: Job) -> str:
        return display.exact_time(obj.run_after)

    @admin.display(description="cancel requested at")
    def cancel_requested_at_display(self, obj: Job) -> str:
        return display.exact_time(obj.cancel_requested_at)

    @admin.display(description="stop requested at")
    def stop_requested_at_display(self, obj: Job) -> str:
        return display.exact_time(obj.stop_requested_at)

    @admin.display(description="lease expires")
    def lease_expires_display(self, obj: Job) -> SafeString:
        return _relative(obj.lease_expires_at, "expired")

    @admin.display(description="last heartbeat")
    def heartbeat_display(self, obj: Job) -> SafeString:
        return _relative(obj.heartbeat_at, "")

    @admin.display(description="lease token")
    def lease_token_display(self, obj: Job) -> SafeString:
        # Its first characters only, enough to tell two leases apart: the whole token is
        # the worker's credential for every write to the job (nothing in the admin needs it).
        return format_html("<code>{}…</code>", str(obj.lease_token)[:TOKEN_SHOWN])

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
            links.append(("parent", job_url(obj.parent_id), short(obj.parent_id)))
        if obj.retry_of_id:
            links.append(("retry of", job_url(obj.retry_of_id), short(obj.retry_of_id)))
        for pk in Job.objects.filter(retry_of=obj.pk).order_by("created_at").values_list("pk", flat=True)[:5]:
            links.append(("retried as", job_url(pk), short(pk)))
        parts = format_html_join(" · ", '{} <a href="{}"><code>{}</code></a>', links)
        children = _children(obj)
        if children:
            parts = format_html("{}{}{}", parts, SafeString("<br>") if links else "", children)
        return parts or format_html("{}", "—")


def _children(parent: Job) -> SafeString:
    """How many child jobs of each status, and the first ``CHILDREN_SHOWN`` of them,
    failed ones first, each with its status. One pass over the children, the count by
    status, which reads the ``(parent, status)`` index alone; then only the rows shown,
    a bounded read of that index for each status among them (a constant number of
    queries, whatever the number of children)."""
    children = Job.objects.filter(parent=parent.pk).order_by()
    counts = dict(children.values_list("status").annotate(n=Count("*")).values_list("status", "n"))
    if not counts:
        return SafeString("")
    rows: list[tuple[Any, str, str]] = []
    left = CHILDREN_SHOWN
    for status in sorted(counts, key=CHILD_ORDER.index):
        if not left:
            break
        take = min(counts[status], left)
        rows += _first(children, status, take)
        left -= take
    # Counted a moment ago: a child that changed status since may be read twice.
    unique = {pk: (pk, kind, status) for pk, kind, status in rows}.values()
    rows = sorted(unique, key=lambda row: (CHILD_ORDER.index(row[2]), row[0]))
    total = sum(counts.values())
    changelist = f"{reverse('admin:jobstate_job_changelist')}?parent__id__exact={parent.pk}"
    head = format_html(
        '<a href="{}">{} child job{}</a>: {}',
        changelist,
        f"{total:,}",
        "" if total == 1 else "s",
        format_html_join(
            " · ",
            '<a href="{}&amp;status={}">{} {}</a>',
            (
                (changelist, s, f"{n:,}", Status(s).label.lower())
                for s in CHILD_ORDER
                if (n := counts.get(s, 0))
            ),
        ),
    )
    shown = format_html_join(
        "",
        '<li>{} <a href="{}"><code>{}</code></a> {}</li>',
        ((display.status_badge(status), job_url(pk), short(pk), kind) for pk, kind, status in rows),
    )
    more = ""
    if total > len(rows):
        more = format_html('<li><a href="{}">all child jobs</a></li>', changelist)
    return format_html('{}<ul class="js-children">{}{}</ul>', head, shown, more)


def _first(children: Any, status: str, n: int) -> list[tuple[Any, str, str]]:
    """``n`` of the children of ``status``, the first the ``(parent, status)`` index
    holds. The status is asked as a range of one value, in whose order the rows come:
    an order that index gives, so the planner reads ``n`` of its entries. Asked with
    ``=``, PostgreSQL may read the table until it meets ``n`` such rows, all of it
    when the parent's rows are at its end (its guess for a LIMIT over many rows)."""
    of_status = children.filter(status__gte=status, status__lte=status).order_by("status")
    return list(of_status.values_list("pk", "kind", "status")[:n])


def _relative(moment: datetime | None, past_word: str) -> SafeString:
    if moment is None:
        return format_html("{}", "-")
    now = timezone.now()
    stamp = display.exact_time(moment)
    if moment < now:
        word = f"{past_word} " if past_word else ""
        css = "js-late" if past_word else "js-muted"
        return format_html(
            '{} <span class="{}">({}{} ago)</span>', stamp, css, word, display.since(moment, now)
        )
    return format_html(
        '{} <span class="js-muted">(in {})</span>', stamp, display.short_duration(moment - now)
    )
