"""The job list's bulk actions: Cancel, Retry and Requeue selected jobs.

Each asks for a confirmation with a reason (what will be done, what refused and
why), then runs the operation (``actions.OPERATIONS``) on each job through
``jobstate.services``, one job at a time, and reports what was done and refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.template.response import TemplateResponse
from django.utils import timezone

from jobstate import services
from jobstate.admin import display
from jobstate.admin.actions import (
    OPERATIONS,
    REASON_MAX_LENGTH,
    REFUSALS,
    Operation,
    held_until,
    posted_text,
    reason_too_long,
    refusal_text,
    refused_groups,
)
from jobstate.exceptions import AlreadyRetried, InvalidTransition
from jobstate.ids import short
from jobstate.models import Job, JobEvent
from jobstate.models.job import with_retried
from jobstate.states import Status
from jobstate.workflows.definition import definition_of

BULK_LIMIT = 1000


class BulkReasonForm(forms.Form):
    """The bulk confirmation's reason; bound only to say that it is missing (the action
    reads it with ``posted_text``)."""

    reason = forms.CharField(
        label="Reason",
        widget=forms.Textarea(
            attrs={"rows": 3, "cols": 60, "maxlength": REASON_MAX_LENGTH, "autofocus": True}
        ),
        help_text="Recorded in each job's history with your user name.",
        error_messages={"required": "Give a reason."},
    )


@dataclass
class BulkReport:
    done: list[Job] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)  # reason: the jobs, as shown
    truncated: bool = False
    held: list[datetime] = field(default_factory=list)  # requeued jobs' starts after their old lease

    def refuse(self, job: Job, reason: str, shown: str = "") -> None:
        self.refused.setdefault(reason, []).append(shown or short(job.pk))

    @property
    def refused_count(self) -> int:
        return sum(len(ids) for ids in self.refused.values())


def run_bulk(op: Operation, jobs: Iterable[Job], user: Any, reason: str) -> BulkReport:
    report = BulkReport()
    done: set[str] = set()
    for job in jobs:
        if op.name == "cancel" and job.status == Status.PROCESSING and job.cancel_requested_at:
            report.refuse(job, "a cancel was already requested; the worker has not ended it yet")
            continue
        try:
            after = op.run(job, user, reason)
        except AlreadyRetried as exc:  # one line for them all, each with its retry
            report.refuse(
                job,
                "already retried, as the job named after each; retry that one instead",
                f"{short(job.pk)} as {short(exc.retry_id)}",
            )
        except InvalidTransition as exc:
            if op.name == "cancel" and exc.current == Status.CANCELLED and _cascaded_from(job.pk, done):
                report.done.append(job)  # a parent selected before it cancelled it: done, not refused
            else:
                report.refuse(job, refusal_text(exc))
        except REFUSALS as exc:
            report.refuse(job, refusal_text(exc))
        else:
            report.done.append(job)
            done.add(str(job.pk))
            held = held_until(after) if op.name == "requeue" else None
            if held is not None:
                report.held.append(held)
    return report


def _cascaded_from(job_id: Any, ancestors: set[str]) -> bool:
    """Whether the cancel of one of ``ancestors`` (ids as text) ended ``job_id``:
    its cancel, or its parent's cancel request, up the chain, names one of them
    (``services.cascade`` records the parent in each child's history row)."""
    seen: set[str] = set()
    while str(job_id) not in seen:
        seen.add(str(job_id))
        metadata = (
            JobEvent.objects.filter(job_id=job_id, transition__in=("cancel", "request_cancel"))
            .order_by("-id")
            .values_list("metadata", flat=True)
            .first()
        )
        parent = metadata.get("parent") if isinstance(metadata, dict) and metadata.get("cascade") else None
        if parent is None:
            return False
        if parent in ancestors:
            return True
        job_id = parent
    return False


def report_messages(request: Any, op: Operation, report: BulkReport, verb: str) -> None:
    n = len(report.done)
    if n:
        messages.success(request, f"{verb} {n:,} job{'s' if n != 1 else ''}.{_held_note(report.held, n)}")
    for why, ids in report.refused.items():
        sample = ", ".join(ids[:10]) + (" …" if len(ids) > 10 else "")
        messages.warning(request, f"Refused {len(ids):,} job{'s' if len(ids) != 1 else ''}: {why} ({sample})")
    if report.truncated:
        messages.warning(request, f"Only the first {BULK_LIMIT:,} selected jobs were processed.")


def _held_note(held: list[datetime], done: int) -> str:
    """The bulk requeue's jobs whose old lease still ran, as its report says them."""
    if not held:
        return ""
    if done == 1:
        when = display.exact_time(held[0])
        return f" Its next attempt starts after {when}, when its old lease would have run out."
    if len(held) == 1:
        return (
            f" 1 of them starts its next attempt after {display.exact_time(held[0])}, "
            "when its old lease would have run out."
        )
    return (
        f" {len(held):,} of them start their next attempt only when their old lease would have run "
        f"out, the last after {display.exact_time(max(held))}."
    )


def nothing_done(op: Operation, refused: list[tuple[str, int]]) -> str:
    """The message of a confirmation posted when no selected job can take ``op``
    (``refused``: ``refused_groups`` of them), which calls no service."""
    if not refused:
        return f"Nothing {op.participle}: none of the selected jobs is in the list any more."
    groups = ", ".join(f"{n:,} {why}" for why, n in refused)
    return f"Nothing {op.participle}: none of the selected jobs can be {op.participle} now ({groups})."


def posted_action_refused(modeladmin: Any, request: Any) -> bool:
    """Whether a POST names one of the list's own actions that this user may not run.
    Django answers one with the list itself (no action runs, and for a user offered no
    action no message either): a confirmation posted after a permission was taken
    away looked done."""
    name = request.POST.get("action", "")
    declared = {getattr(a, "__name__", "") for a in modeladmin.actions or ()}
    return name in declared and name not in modeladmin.get_actions(request)


GONE = "no longer in the list (deleted meanwhile, or no longer matching its filters)"


def _not_found(selected: list[str], jobs: list[Job]) -> list[Any]:
    """The selected ids (well-formed: ``SafeListAdmin.response_action``) of no loaded job."""
    pk = Job._meta.pk
    assert pk is not None
    found = {job.pk for job in jobs}
    missing: list[Any] = []
    for value in selected:
        key = pk.to_python(value)
        if key not in found and key not in missing:
            missing.append(key)
    return missing


def _workflows(op: Operation, jobs: list[Job]) -> int:
    """How many of the jobs a bulk retry retries are workflows (each runs again from
    its first step): the registry's, no query."""
    if op.name != "retry":
        return 0
    return sum(1 for job in jobs if op.allowed(job) and definition_of(job.kind) is not None)


def _paused(op: Operation, jobs: list[Job]) -> tuple[int, list[str]]:
    """How many of the jobs a requeue or a retry queues are of a paused kind (no worker
    claims them until it is resumed), and those kinds."""
    if op.name not in ("requeue", "retry"):
        return 0, []
    paused = {p.kind for p in services.paused_kinds()}
    kinds = [j.kind for j in jobs if j.kind in paused and op.allowed(j)]
    return len(kinds), sorted(set(kinds))


def _lease_runs(op: Operation, jobs: list[Job]) -> tuple[int, datetime | None]:
    """How many of the jobs a bulk requeue requeues hold a lease that still runs (each is
    not claimed again before it would have run out: ``services.requeue``), and the last
    such lease's end. A job reserved and never begun runs again at once."""
    if op.name != "requeue":
        return 0, None
    now = timezone.now()
    ends = [
        j.lease_expires_at
        for j in jobs
        if j.status == Status.PROCESSING
        and j.started_at is not None
        and j.lease_expires_at is not None
        and j.lease_expires_at > now
    ]
    return len(ends), max(ends, default=None)


def _bulk_action(name: str, verb: str, description: str) -> Callable[..., Any]:
    op = OPERATIONS[name]

    def action(modeladmin: Any, request: Any, queryset: QuerySet[Job]) -> Any:
        reason = posted_text(request, "reason")
        confirmed = request.POST.get("confirm") == "yes"
        jobs = list(with_retried(queryset).order_by("-created_at", "pk")[: BULK_LIMIT + 1])
        truncated = len(jobs) > BULK_LIMIT
        jobs = jobs[:BULK_LIMIT]
        allowed = sum(1 for j in jobs if op.allowed(j))
        refused = refused_groups(op, jobs)
        # A confirmation posted when no selected job can take the operation any more (its
        # page read before they changed, or a crafted POST): no service is called.
        nothing = confirmed and not allowed
        too_long = reason_too_long(reason) if confirmed and not nothing else None
        if too_long:
            messages.error(request, f"Reason: {too_long}")
        if not nothing and (not confirmed or not reason or too_long):
            lease_runs, lease_end = _lease_runs(op, jobs)
            title = f"{op.label} {allowed:,} job{'s' * (allowed != 1)}" if allowed else f"Nothing to {name}"
            context = {
                **modeladmin.admin_site.each_context(request),
                "title": title,
                "opts": modeladmin.model._meta,
                "operation": op,
                "summary": op.summary_for(allowed or len(jobs)),
                "action_name": action.__name__,
                "jobs": jobs[:100],
                "more": len(jobs) - 100 if len(jobs) > 100 else 0,
                "allowed": allowed,
                "refused": refused,
                "refused_count": sum(n for _, n in refused),
                "workflows": _workflows(op, jobs),
                "lease_runs": lease_runs,
                "lease_end": display.exact_time(lease_end) if lease_end else "",
                "woken": sum(1 for j in jobs if op.name == "requeue" and j.status == Status.WAITING),
                "paused": _paused(op, jobs),
                "count": len(jobs),
                "truncated": truncated,
                "form": BulkReasonForm(
                    {"reason": ""} if confirmed and not reason else None, initial={"reason": reason}
                ),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "select_across": request.POST.get("select_across", "0"),
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "media": modeladmin.media,
            }
            return TemplateResponse(request, "admin/jobstate/job/bulk_confirm.html", context)
        if nothing:
            report = BulkReport()
            messages.warning(request, nothing_done(op, refused))
        else:
            report = run_bulk(op, jobs, request.user, reason)
        report.truncated = truncated
        if not truncated and request.POST.get("select_across", "0") == "0":
            for pk in _not_found(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME), jobs):
                report.refused.setdefault(GONE, []).append(short(pk))
        report_messages(request, op, report, verb)
        return None

    action.__name__ = f"{name}_selected"
    action.allowed_permissions = (name,)  # type: ignore[attr-defined]
    action.short_description = description  # type: ignore[attr-defined]
    return action


cancel_selected = _bulk_action("cancel", "Cancelled or asked to stop", "Cancel selected jobs…")
retry_selected = _bulk_action("retry", "Queued a retry for", "Retry selected jobs…")
requeue_selected = _bulk_action("requeue", "Requeued", "Requeue selected jobs…")
