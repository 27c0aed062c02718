"""jobstate's own jobs in the admin: their kinds, and why a delivery sent nothing.

The only kind jobstate registers itself is the webhook delivery's
(``jobstate.webhooks.outbox.KIND``): workflow and ``@task`` kinds are the project's.
A delivery whose endpoint is disabled or deleted, whose owner is inactive or whose
job is gone completes with ``{"skipped": why}`` (``jobstate.webhooks.delivery``):
its status alone reads "Completed", like a delivered one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate.models import Job
from jobstate.states import Status
from jobstate.webhooks.outbox import KIND as DELIVERY_KIND

KINDS = (DELIVERY_KIND,)

# Where ``load_skipped`` keeps a row's reason when its result was not loaded.
_SKIPPED = "_js_skipped"


def _reason(result: Any) -> str | None:
    why = result.get("skipped") if isinstance(result, dict) else None
    return why if isinstance(why, str) else None


def _may_be_skipped(job: Job) -> bool:
    return job.kind in KINDS and job.status == Status.COMPLETED


def skipped(job: Job) -> str | None:
    """Why a completed job of jobstate's own did nothing, or None. Never queries:
    a row whose result is deferred (the list, the live refresh) answers what
    ``load_skipped`` found for it, else None."""
    if not _may_be_skipped(job):
        return None
    if _SKIPPED in job.__dict__:
        reason: str | None = job.__dict__[_SKIPPED]
        return reason
    if "result" in job.get_deferred_fields():
        return None
    return _reason(job.result)


def load_skipped(rows: Iterable[Job]) -> None:
    """Read the results of the rows that may be skipped deliveries and whose result
    was deferred: one query for all of them, none when there is none."""
    wanted = {
        row.pk: row
        for row in rows
        if _may_be_skipped(row) and _SKIPPED not in row.__dict__ and "result" in row.get_deferred_fields()
    }
    if not wanted:
        return
    using = next(iter(wanted.values()))._state.db
    results = dict(Job.objects.using(using).filter(pk__in=wanted).values_list("pk", "result"))
    for pk, row in wanted.items():
        row.__dict__[_SKIPPED] = _reason(results.get(pk))


def status_note(job: Job, badge: SafeString, *, full: bool = False) -> SafeString:
    """``badge`` with "skipped" and why after it for a skipped delivery: in the list
    the reason's head (``endpoint disabled``), all of it on hover; ``full``: all of it."""
    why = skipped(job)
    if why is None:
        return badge
    if full:
        return format_html('{} <span class="js-flag">skipped</span> {}', badge, why)
    return format_html(
        '{} <span class="js-flag" title="{}">skipped: {}</span>', badge, why, why.split(":", 1)[0]
    )
