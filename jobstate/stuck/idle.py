"""Reasons a job no worker holds is stuck: queued past due with no worker serving
its kind, waiting for children none of which is active any more, failed for
good and not retried."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q

from jobstate import registry
from jobstate.models import Job
from jobstate.services.retryable import retryable_q
from jobstate.states import ACTIVE, Status
from jobstate.stuck.codes import OPERATOR_FAILED
from jobstate.stuck.context import Context, _ago, _seconds


def _q_queued_no_worker(ctx: Context) -> Q:
    # Positive on the (few, usually zero) unserved kinds, so the (kind, status)
    # index answers it; with none, the filter matches nothing without a query.
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return Q(status=Status.QUEUED, run_after__lt=due, kind__in=ctx.unserved_kinds)


def _q_queued_kind_paused(ctx: Context) -> Q:
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return Q(status=Status.QUEUED, run_after__lt=due, kind__in=sorted(ctx.paused))


def _is_queued_kind_paused(job: Job, ctx: Context) -> bool:
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return job.status == Status.QUEUED and job.run_after < due and job.kind in ctx.paused


def _describe_paused(job: Job, ctx: Context) -> str:
    pause = ctx.paused.get(job.kind)
    if pause is None:  # resumed meanwhile
        return f"Due {_ago(job.run_after, ctx.now)} and still queued: its kind '{job.kind}' was paused."
    why = f": {pause.reason}" if pause.reason else ""
    return (
        f"Due {_ago(job.run_after, ctx.now)} and still queued: kind '{job.kind}' paused by "
        f"{pause.paused_by_text} {_ago(pause.paused_at, ctx.now)}{why}. No worker claims it until "
        "the kind is resumed."
    )


def _is_queued_no_worker(job: Job, ctx: Context) -> bool:
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return job.status == Status.QUEUED and job.run_after < due and job.kind in ctx.unserved_kinds


def _q_waiting_no_children(ctx: Context) -> Q:
    """Waiting jobs none of whose children is active (the wake-up was lost: the
    transaction that ended the last child should have woken it)."""
    live = Job.objects.filter(parent_id=OuterRef("pk"), status__in=ACTIVE)
    return Q(status=Status.WAITING) & ~Q(Exists(live))


def _is_waiting_no_children(job: Job, ctx: Context) -> bool:
    return (
        job.status == Status.WAITING and not Job.objects.filter(parent_id=job.pk, status__in=ACTIVE).exists()
    )


def _later_with_key(**owner: Any) -> Q:
    return Q(
        Exists(
            Job.objects.filter(
                kind=OuterRef("kind"), key=OuterRef("key"), created_at__gt=OuterRef("created_at"), **owner
            )
        )
    )


def _not_superseded() -> Q:
    """No later job took the failed job's idempotency key (an enqueue with the key
    replaces a failed job): else the key's work goes on there, and a retry of this
    one would be refused while that job is active. Keys are scoped per owner."""
    return (
        Q(key__isnull=True)
        | (Q(owner__isnull=True) & ~_later_with_key(owner__isnull=True))
        | (Q(owner__isnull=False) & ~_later_with_key(owner_id=OuterRef("owner_id")))
    )


def _q_recently_failed(ctx: Context) -> Q:
    """Failed lately and retryable (``services.retryable``: its remedy, a retry, is
    accepted, so a job leaves the list once retried), not failed on purpose by an
    operator, and not superseded by a later job with its key."""
    since = ctx.now - _seconds("STUCK_RECENT_FAILURE_SECONDS")
    return (
        Q(status=Status.FAILED, finished_at__gte=since)
        & ~Q(error_type=OPERATOR_FAILED)
        & retryable_q()
        & _not_superseded()
    )


def _is_recently_failed(job: Job, ctx: Context) -> bool:
    since = ctx.now - _seconds("STUCK_RECENT_FAILURE_SECONDS")
    return (
        job.status == Status.FAILED
        and job.finished_at is not None
        and job.finished_at >= since
        and job.error_type != OPERATOR_FAILED
        and Job.objects.filter(Q(pk=job.pk) & retryable_q() & _not_superseded()).exists()
    )


def _describe_queued(job: Job, ctx: Context) -> str:
    due = f"Due {_ago(job.run_after, ctx.now)} and still queued"
    if job.kind not in registry.all_handlers():
        # Workers claim the kinds their code registers: with the same code as this
        # process, none will ever claim it (an older worker still might, mid-deploy).
        return (
            f"{due}: no handler or task is registered as '{job.kind}' in this code (renamed or "
            "removed?), so no worker running it will claim the job. Cancel it, or deploy code that "
            "registers the kind again."
        )
    return f"{due}: no worker has run a '{job.kind}' job recently."


def _describe_waiting(job: Job, ctx: Context) -> str:
    return (
        f"Waiting for its children since {_ago(job.updated_at, ctx.now)}, but none of them is "
        "queued or running any more: nothing will wake it."
    )


def _describe_failed(job: Job, ctx: Context) -> str:
    return (
        f"Failed {_ago(job.finished_at, ctx.now)} after attempt {job.attempts}/{job.max_attempts}: "
        f"{(job.error_message or '').strip()[:200]}"
    )
