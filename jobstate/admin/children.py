"""What ending a parent job from the admin does to its unfinished children
(``services.cascade``): counted on the confirmation page, then in the result message."""

from __future__ import annotations

from django.db.models import Count

from jobstate.models import Job, JobEvent
from jobstate.services import cascade
from jobstate.states import TERMINAL


def to_end(job: Job) -> int:
    """How many children the cascade would end now (``cascade.to_end``); their own
    children go with them, uncounted."""
    return cascade.to_end(job.pk).count()


def ended(after: Job) -> str:
    """What the operation that left ``after`` as it is did to its children, for its
    result message: '; 5 child jobs cancelled, 2 asked to stop', or '' for none. The
    cascade's history rows carry the parent's own time: its end, or its cancel request."""
    stamp = after.finished_at if after.status in TERMINAL else after.cancel_requested_at
    if stamp is None:
        return ""
    rows = dict(
        JobEvent.objects.filter(
            job__parent_id=after.pk, created_at=stamp, transition__in=("cancel", "request_cancel")
        )
        .order_by()
        .values_list("transition")
        .annotate(n=Count("id"))
    )
    cancelled, asked = rows.get("cancel", 0), rows.get("request_cancel", 0)
    parts = [f"{_jobs(cancelled)} cancelled"] if cancelled else []
    if asked:
        parts.append(f"{asked:,} asked to stop" if parts else f"{_jobs(asked)} asked to stop")
    return "; " + ", ".join(parts) if parts else ""


def _jobs(n: int) -> str:
    return f"{n:,} child job{'s' if n != 1 else ''}"
