"""The live refresh's JSON endpoint: ``<admin>/jobstate/job/live/``.

``jobstate/live.js`` polls it every second or so while a page shows an active
job, and stops once nothing shown is active. Wrapped by ``admin_site.admin_view``
(staff login) and checked against the job view permission like the pages.

Query parameters:

- ``ids``: comma-separated job ids shown on the page (at most ``MAX_IDS``; others
  and malformed ids are ignored). Each known job comes back with its status,
  progress and the HTML of what changes on the page that asks:
- ``mode``: ``list`` (the list's cells), ``job`` (the job page's fields) or
  ``dashboard`` (neither); without it, both (a page loaded before ``mode`` existed).
- ``dashboard=1``: also the dashboard's live tiles and its workers panel.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, JsonResponse
from django.utils.html import conditional_escape

from jobstate import stuck
from jobstate.admin import own_jobs, workers
from jobstate.models import Job
from jobstate.states import ACTIVE, Status

MAX_IDS = 200
LIST_CELLS = ("status_col", "progress_col", "attempts_col", "age_col")
PAGE_FIELDS = (
    "status_display",
    "progress_display",
    "step_display",
    "attempts_display",
    "duration_display",
    "heartbeat_display",
)
DEFERRED = ("parameters", "result", "traceback", "error_message")  # heavy, never shown here
# What each page's live.js sets: (the list's cells, the job page's fields).
MODES: dict[str, tuple[bool, bool]] = {
    "list": (True, False),
    "job": (False, True),
    "dashboard": (False, False),
    "": (True, True),
}


def parse_ids(raw: str) -> list[uuid.UUID]:
    found: list[uuid.UUID] = []
    for part in raw.split(",")[:MAX_IDS]:
        try:
            found.append(uuid.UUID(part.strip()))
        except ValueError:
            continue
    return found


def html(value: Any) -> str:
    """``live.js`` sets the cells and fields as HTML (innerHTML): a SafeString
    passes, any other value (a display method returning the job's own text) is escaped."""
    return str(conditional_escape(value))


def job_payload(
    model_admin: Any, job: Job, cells: tuple[str, ...] = LIST_CELLS, fields: tuple[str, ...] = PAGE_FIELDS
) -> dict[str, Any]:
    # progress_message and current_step are text, not HTML: live.js does not insert them.
    return {
        "status": job.status,
        "active": job.status in ACTIVE,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "current_step": job.current_step,
        "attempts": job.attempts,
        "cells": {name: html(getattr(model_admin, name)(job)) for name in cells},
        "fields": {name: html(getattr(model_admin, name)(job)) for name in fields},
    }


def dashboard_payload(request: HttpRequest, now: datetime) -> dict[str, Any]:
    """The dashboard's live tiles and workers panel as of ``now`` (the database's
    clock on PostgreSQL, which ``seen_at`` is written by)."""
    counts = {s: 0 for s in (Status.QUEUED, Status.PROCESSING)}
    for status, n in (
        Job.objects.filter(status__in=ACTIVE).order_by().values_list("status").annotate(n=Count("*"))
    ):
        counts[status] = counts.get(status, 0) + n
    panel = workers.panel_context(now)  # once: the tiles' counts and the panel's HTML
    found = panel["workers"]
    return {
        "active": sum(counts.values()),
        "counts": {**counts, "workers": found.alive, "busy": found.busy},
        "html": {"js-workers": html(workers.render_panel(request, panel))},
    }


def live_view(model_admin: Any, request: HttpRequest) -> JsonResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    mode = request.GET.get("mode", "")
    if mode not in MODES:
        return JsonResponse(
            {"error": f"mode must be one of: {', '.join(m for m in MODES if m)}."}, status=400
        )
    want_cells, want_fields = MODES[mode]
    cells, fields = (LIST_CELLS if want_cells else ()), (PAGE_FIELDS if want_fields else ())
    ids = parse_ids(request.GET.get("ids", ""))
    jobs = list(Job.objects.filter(pk__in=ids).defer(*DEFERRED).order_by()) if ids else []
    dashboard = bool(request.GET.get("dashboard"))
    # One for all rows (the list's status cell flags stuck jobs), as the list does, and
    # its time (PostgreSQL's clock: one query) for the dashboard too.
    ctx = stuck.Context() if (jobs and cells) or dashboard else None
    for job in jobs:
        job._stuck_ctx = ctx  # type: ignore[attr-defined]
    own_jobs.load_skipped(jobs)  # a delivery just completed: whether it was skipped
    payload: dict[str, Any] = {
        "jobs": {str(job.pk): job_payload(model_admin, job, cells, fields) for job in jobs}
    }
    payload["active"] = sum(1 for j in payload["jobs"].values() if j["active"])
    if dashboard and ctx is not None:
        payload["dashboard"] = dashboard_payload(request, ctx.now)
        payload["active"] += payload["dashboard"]["active"]
    return JsonResponse(payload)  # admin_view adds never_cache
