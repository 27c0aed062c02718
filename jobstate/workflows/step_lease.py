"""The lease check every write to a workflow's ``JobStep`` rows makes.

Every change a worker makes to a step happens in one transaction with a lease
check on its job: ``services.report_progress`` (or ``services.heartbeat``) is a
token-guarded UPDATE of the job row, so a worker that lost its lease writes
nothing, and on PostgreSQL the row stays locked until the step change commits,
so the reaper cannot take the job half-way.
"""

from __future__ import annotations

from typing import Any

from jobstate import services
from jobstate.exceptions import CancelRequested
from jobstate.models import Job
from jobstate.services.actors import Actor


def hold(
    job: Job,
    token: Any,
    *,
    percent: float | None = None,
    message: str | None = None,
    step: str | None = None,
    cancel_ok: bool = False,
) -> bool:
    """Prove (inside the caller's transaction) that ``token`` still owns ``job``,
    renewing its lease and moving its progress. Raises ``LeaseLost``, or
    ``CancelRequested`` unless ``cancel_ok`` (finishing a step that already ran);
    returns whether a cancel is pending."""
    if percent is not None:
        percent = min(100.0, max(0.0, float(percent)))
    try:
        services.report_progress(job, token, percent, message, step=step)
    except CancelRequested:
        if not cancel_ok:
            raise
        services.heartbeat(job, token)
        return True
    return False


def actor_of(job: Job) -> Actor:
    return Actor.worker(job.worker_id or "?")
