"""Reasons a processing job is stuck: a cancel not honoured, an expired lease, past
its timeout, a silent heartbeat.

Each query below is exclusive on its own: it restates, as positive and
index-friendly conditions, that no earlier reason applies (a NOT around an
earlier reason would make PostgreSQL read every processing row)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from jobstate.models import Job
from jobstate.services.recovery_runs import recovering, recovering_q
from jobstate.states import Status
from jobstate.stuck.context import Context, _ago, _seconds, timeout_for, timeouts


def _cancel_limit(ctx: Context) -> datetime:
    return ctx.now - _seconds("STUCK_CANCEL_UNHONOURED_SECONDS")


def _no_pending_cancel(ctx: Context) -> Q:
    recent = Q(cancel_requested_at__gte=_cancel_limit(ctx))
    return Q(cancel_requested_at__isnull=True) | recent | recovering_q()


# A run its history marks as a recovery run (``recovery_runs.recovering``: a workflow's undos,
# which a cancel does not stop; a plain begin refuses a job with a cancel request) is
# honouring the cancel, bounded by its timeout, so "cancel not honoured" leaves it out.
# Read from the history, not by comparing ``started_at`` (a worker's clock) with
# ``cancel_requested_at`` (the canceller's): a skew of seconds would decide it.
def _honouring(job: Job) -> bool:
    return job.cancel_requested_at is not None and recovering(job.pk)


def _timed_out(ctx: Context, over: bool) -> Q:
    """Processing jobs started before (``over``) or since their kind's timeout plus grace."""
    custom, default = timeouts()
    grace = _seconds("STUCK_TIMEOUT_GRACE_SECONDS")
    op = "started_at__lt" if over else "started_at__gte"
    q = ~Q(kind__in=list(custom)) & Q(**{op: ctx.now - timedelta(seconds=default) - grace})
    for kind, seconds in custom.items():
        q |= Q(kind=kind, **{op: ctx.now - timedelta(seconds=seconds) - grace})
    return q


def _q_cancel_unhonoured(ctx: Context) -> Q:
    return Q(status=Status.PROCESSING, cancel_requested_at__lt=_cancel_limit(ctx)) & ~recovering_q()


def _is_cancel_unhonoured(job: Job, ctx: Context) -> bool:
    return (
        job.status == Status.PROCESSING
        and job.cancel_requested_at is not None
        and job.cancel_requested_at < _cancel_limit(ctx)
        and not _honouring(job)
    )


def _q_lease_expired(ctx: Context) -> Q:
    return Q(status=Status.PROCESSING, lease_expires_at__lt=ctx.now) & _no_pending_cancel(ctx)


def _is_lease_expired(job: Job, ctx: Context) -> bool:
    return (
        job.status == Status.PROCESSING
        and job.lease_expires_at is not None
        and job.lease_expires_at < ctx.now
    )


def _q_past_timeout(ctx: Context) -> Q:
    live = Q(status=Status.PROCESSING, lease_expires_at__gte=ctx.now)
    return live & _no_pending_cancel(ctx) & _timed_out(ctx, over=True)


def _is_past_timeout(job: Job, ctx: Context) -> bool:
    if job.status != Status.PROCESSING or job.started_at is None:
        return False
    limit = timedelta(seconds=timeout_for(job.kind)) + _seconds("STUCK_TIMEOUT_GRACE_SECONDS")
    return job.started_at < ctx.now - limit


def _q_no_heartbeat(ctx: Context) -> Q:
    silent = ctx.now - _seconds("STUCK_NO_HEARTBEAT_SECONDS")
    live = Q(status=Status.PROCESSING, lease_expires_at__gte=ctx.now, heartbeat_at__lt=silent)
    return live & _no_pending_cancel(ctx) & _timed_out(ctx, over=False)


def _is_no_heartbeat(job: Job, ctx: Context) -> bool:
    # Begun jobs only, as the query's rule: a job its cluster only reserved has no
    # worker to beat yet; the cluster renews its lease (lease_expired otherwise).
    limit = ctx.now - _seconds("STUCK_NO_HEARTBEAT_SECONDS")
    return (
        job.status == Status.PROCESSING
        and job.started_at is not None
        and job.heartbeat_at is not None
        and job.heartbeat_at < limit
    )


def _describe_cancel(job: Job, ctx: Context) -> str:
    return (
        f"Cancel requested {_ago(job.cancel_requested_at, ctx.now)} but the job is still processing "
        f"on worker {job.worker_id or '?'}."
    )


def _describe_lease(job: Job, ctx: Context) -> str:
    if job.started_at is None:
        return (
            f"Lease expired {_ago(job.lease_expires_at, ctx.now)} while reserved by cluster "
            f"{job.worker_id or '?'}, which stopped before any of its workers started it: "
            "it goes back to the queue with no attempt spent."
        )
    return (
        f"Lease expired {_ago(job.lease_expires_at, ctx.now)}: worker {job.worker_id or '?'} is "
        f"presumed lost (last heartbeat {_ago(job.heartbeat_at, ctx.now)})."
    )


def _describe_timeout(job: Job, ctx: Context) -> str:
    return (
        f"Running since {_ago(job.started_at, ctx.now)}, past its handler timeout of "
        f"{int(timeout_for(job.kind))} s."
    )


def _describe_heartbeat(job: Job, ctx: Context) -> str:
    return (
        f"No heartbeat from worker {job.worker_id or '?'} since {_ago(job.heartbeat_at, ctx.now)}; "
        f"the lease still runs until {job.lease_expires_at:%Y-%m-%d %H:%M:%S}."
        if job.lease_expires_at
        else f"No heartbeat since {_ago(job.heartbeat_at, ctx.now)}."
    )
