"""Admin pages beyond the model forms: a transition with its reason, and the
stuck jobs with one-click remedies (the dashboard is in ``dashboard.py``).

Each view is wrapped by ``admin_site.admin_view`` (staff login, CSRF, no cache)
in ``JobAdmin.get_urls`` and checks the operation's own permission.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from jobstate import services, stuck
from jobstate.admin import children, display, workflow_retry
from jobstate.admin.actions import (
    OPERATIONS,
    REASON_MAX_LENGTH,
    REFUSALS,
    Operation,
    not_offered,
    posted_text,
    reason_too_long,
    refusal_text,
)
from jobstate.ids import short
from jobstate.models import Job
from jobstate.services import Actor
from jobstate.services.control import cancel_run_pending
from jobstate.states import Status

# The stuck page counts each reason up to this many jobs ("1,000+").
PAGE_COUNT_CAP = 1000

# The one-click remedy each stuck reason offers. Starting a worker is no click:
# the click for a queued job nobody serves is to cancel it (services.request_cancel).
REMEDY_OPERATION = {
    stuck.REQUEUE: "requeue",
    stuck.FORCE_CANCEL: "force_cancel",
    stuck.RETRY: "retry",
    stuck.START_WORKER: "cancel",
}


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "autofocus": True}),
        help_text="Recorded in the job's history with your user name.",
        error_messages={"required": "Give a reason."},
    )

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("Give a reason.")
        return reason


def job_url(job: Job | Any) -> str:
    pk = job.pk if isinstance(job, Job) else job
    return reverse("admin:jobstate_job_change", args=[pk])


def page_context(model_admin: Any, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "app_label": model_admin.model._meta.app_label,
        "media": model_admin.media,
        **extra,
    }


def _perform(
    request: HttpRequest, op: Operation, job: Job, reason: str, from_step: str | None = None
) -> Job | None:
    """Run ``op`` through the services (a workflow's retry ``from_step``: ``retry_from``);
    report the outcome as a message."""
    before = job
    try:
        if from_step:
            after = workflow_retry.retry_from_step(job, request.user, reason, from_step)
        else:
            after = op.run(job, request.user, reason)
    except REFUSALS as exc:
        messages.error(request, f"{op.label} refused: {refusal_text(exc)}")
        return None
    messages.success(request, op.done(before, after))
    return after


def transition_view(model_admin: Any, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
    """GET: the confirmation page asking for a reason. POST: perform it."""
    op = OPERATIONS.get(name)
    if op is None:
        raise PermissionDenied
    if not model_admin.has_view_permission(request) or not op.has_permission(request.user):
        raise PermissionDenied
    job = Job.objects.select_related("owner").filter(pk=object_id).first()
    if job is None:  # deleted since its page was read (retention, another operator)
        messages.error(request, f"{op.label} refused: job {object_id} does not exist (any more).")
        return HttpResponseRedirect(reverse("admin:jobstate_job_changelist"))
    if not model_admin.has_view_permission(request, job):
        raise PermissionDenied
    form = ReasonForm(request.POST or None)
    steps = workflow_retry.retry_steps(job) if op.name == "retry" and op.allowed(job) else None
    if steps:
        form.fields["from_step"] = workflow_retry.from_step_field(steps)
    if request.method == "POST" and form.is_valid() and op.allowed(job):
        after = _perform(request, op, job, form.cleaned_data["reason"], form.cleaned_data.get("from_step"))
        target = after if after is not None and op.name == "retry" else job
        return HttpResponseRedirect(job_url(target))
    # Not offered in the job's state (a POST crafted, or made from a page read
    # before the job changed): the button's own rule holds, nothing is written.
    if not op.allowed(job):
        messages.warning(request, not_offered(op, job))
        return HttpResponseRedirect(job_url(job))
    return TemplateResponse(
        request,
        "admin/jobstate/job/transition_form.html",
        page_context(
            model_admin,
            request,
            f"{op.label} job {short(job.pk)}",
            job=job,
            job_name=f"{job.kind} {short(job.pk)}",
            original=job,
            operation=op,
            form=form,
            status_badge=display.status_badge(job.status),
            cancel_requested_ago=display.since(job.cancel_requested_at, timezone.now()),
            finding=stuck.check(job),
            children_to_end=children.to_end(job) if op.ends_children else 0,
            workflow_note=workflow_retry.note(steps) if steps else "",
        ),
    )


def stuck_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    ctx = stuck.Context()  # the database's clock, which heartbeats are written by
    now = ctx.now
    cap = min(PAGE_COUNT_CAP, model_admin.count_cap())
    # Counted one past the cap: "1,000+" says more than 1,000, exactly 1,000 reads "1,000".
    findings, counts = stuck.survey(ctx=ctx, cap=cap + 1)
    groups = []
    changelist = reverse("admin:jobstate_job_changelist")
    for r in stuck.REASONS:
        rows = [f for f in findings if f.reason == r.code]
        op = OPERATIONS.get(REMEDY_OPERATION.get(r.remedy, ""))
        n = min(cap, counts[r.code])
        groups.append(
            {
                "reason": r,
                "count": n,
                "count_label": f"{n:,}+" if counts[r.code] > cap else f"{n:,}",
                "more": max(0, n - len(rows)),
                "list_url": f"{changelist}?stuck={r.code}",
                "operation": op if op is not None and op.has_permission(request.user) else None,
                "rows": [
                    {
                        "finding": f,
                        "job": f.job,
                        "badge": display.status_badge(f.job.status),
                        "age": display.since(f.since, now),
                    }
                    for f in rows
                ],
            }
        )
    return TemplateResponse(
        request,
        "admin/jobstate/job/stuck.html",
        page_context(
            model_admin,
            request,
            "Stuck jobs",
            groups=groups,
            # The reasons without a job: one line, not a heading and a remedy each.
            empty=[g["reason"].title for g in groups if not g["count"]],
            # The dashboard tile's words and sums: stuck (active jobs), and failed after
            # their last attempt, each of its reasons counted up to the cap ("+" past it).
            **_capped_sum("total", counts, cap, set(counts)),
            **_capped_sum("stuck", counts, cap, stuck.ACTIVE_REASONS),
            **_capped_sum("failed", counts, cap, set(counts) - stuck.ACTIVE_REASONS),
            expired=counts[stuck.LEASE_EXPIRED],
            can_reap=may_reap(model_admin, request),
            now=now,
        ),
    )


def _capped_sum(name: str, counts: dict[str, int], cap: int, codes: AbstractSet[str]) -> dict[str, Any]:
    """``name``: the sum of the reasons' counts in ``codes``, each up to ``cap``;
    ``name_capped``: whether one of them was past it; ``name_label``: "1,000+"."""
    chosen = [n for code, n in counts.items() if code in codes]
    total, capped = sum(min(cap, n) for n in chosen), any(n > cap for n in chosen)
    return {name: total, f"{name}_capped": capped, f"{name}_label": f"{total:,}{'+' * capped}"}


def stuck_remedy_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """One click from the stuck page: the remedy for one job, with an automatic reason."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    back = HttpResponseRedirect(reverse("admin:jobstate_job_stuck"))
    op = OPERATIONS.get(request.POST.get("operation", ""))
    if op is None or op.name not in REMEDY_OPERATION.values():
        raise PermissionDenied
    if not model_admin.has_view_permission(request) or not op.has_permission(request.user):
        raise PermissionDenied
    try:
        job = Job.objects.get(pk=request.POST.get("job", ""))
    except (Job.DoesNotExist, ValueError, ValidationError):
        messages.error(request, "That job does not exist (any more).")
        return back
    if op.name == "cancel" and job.status != Status.QUEUED:
        # The click meant "nobody will run it"; a job that started meanwhile is served.
        label = Status(job.status).label.lower()
        messages.error(request, f"Cancel refused: the job is {label} now; open it to cancel it.")
        return back
    finding = stuck.check(job)
    if finding is None or REMEDY_OPERATION.get(finding.remedy) != op.name:
        # A page read before the job changed (a second click, another operator):
        # acting now would, say, retry it twice or requeue a job whose worker is back.
        messages.error(request, "This job is no longer stuck that way; open it to act on it.")
        return back
    title = finding.title.lower()
    note = posted_text(request, "note")
    reason = f"stuck remedy ({title})" + (f": {note}" if note else "")
    too_long = reason_too_long(reason)
    if too_long is not None:  # refused, as the job page's form refuses one: not cut short
        messages.error(request, f"The note is too long: {too_long}")
        return back
    if op.name == "cancel" and job.status == Status.QUEUED and job.cancel_requested_at is not None:
        op = OPERATIONS["force_cancel"]  # queued for its cancel's run, which no worker takes
    try:
        after = op.run(job, request.user, reason)
    except REFUSALS as exc:
        messages.error(request, f"{op.label} of job {short(job.pk)} refused: {refusal_text(exc)}")
        return back
    messages.success(request, remedy_done(op, job, after))
    return back


def remedy_done(op: Operation, before: Job, after: Job) -> str:
    """The remedy's outcome, naming the job: the page lists many."""
    job = f"Job {short(before.pk)}"
    if op.name == "retry":
        return f"{job} retried: the new job is {after.pk}."
    if op.name == "requeue":
        if before.status == Status.WAITING:
            return f"{job} woken: queued again."
        return op.done(before, after).replace("Job", job, 1)  # when its next attempt starts
    if after.status != Status.CANCELLED:  # queued for one run of its undos
        return f"{job}: cancel requested; it is {after.status} for one run of its undos, then ends cancelled."
    if op.name == "force_cancel":
        if before.status == Status.QUEUED:
            return f"{job} cancelled" + (", its undos not run." if cancel_run_pending(before) else ".")
        return f"{job} cancelled on behalf of its worker."
    return f"{job} cancelled."


def may_reap(model_admin: Any, request: HttpRequest) -> bool:
    """The reaper requeues or fails every expired job: the requeue operation's
    permission, with the job view permission every operation view asks for."""
    requeue = OPERATIONS["requeue"]
    return bool(model_admin.has_view_permission(request)) and requeue.has_permission(request.user)


def reap_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """Run the reaper now: every expired lease is requeued, failed or cancelled, once
    the operator confirmed it on the page this view shows first (it acts on many jobs)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not may_reap(model_admin, request):
        raise PermissionDenied
    if request.POST.get("confirmed") != "yes":
        ctx = stuck.Context()
        expired = stuck.count_stuck(codes={stuck.LEASE_EXPIRED}, cap=PAGE_COUNT_CAP + 1, ctx=ctx)
        n = expired.get(stuck.LEASE_EXPIRED, 0)
        return TemplateResponse(
            request,
            "admin/jobstate/job/reap_confirm.html",
            page_context(
                model_admin,
                request,
                "Run the reaper now?",
                expired=n,
                expired_label=f"{PAGE_COUNT_CAP:,}+" if n > PAGE_COUNT_CAP else f"{n:,}",
                now=ctx.now,
            ),
        )
    # The reaper's own label (metrics and task results count its rows by it), with
    # the admin user who ran it.
    report = services.requeue_expired(actor=Actor("system:reaper", request.user))
    held = f" {len(report.skipped)} left for the next sweep (held by a transaction)." * bool(report.skipped)
    held += f" {len(report.errors)} not reaped (an error, logged)." * bool(report.errors)
    held += " More expired jobs remain past the sweep's limit: run it again." * report.more
    messages.success(
        request,
        f"Reaper ran: {len(report.requeued)} requeued, {len(report.failed)} failed (no attempt left), "
        f"{len(report.cancelled)} cancelled (cancel was pending).{held}",
    )
    return HttpResponseRedirect(reverse("admin:jobstate_job_stuck"))
