"""Stuck-job detection: which jobs need a person, why, and what fixes them.

One place for the admin's stuck page, the API, ``manage.py jobstate_stuck``
and monitoring. Every reason is a database filter (so lists and counts stay
cheap on large tables) plus a pure-Python check of a loaded job that agrees with
it. A job is reported once, under the first reason in ``REASONS`` it matches.
Thresholds are settings (``JOBSTATE["STUCK_*"]``, see ``jobstate.conf``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Exists, Model, OuterRef, Q, QuerySet
from django.utils import timezone
from django.utils.timesince import timesince

from jobstate import conf, registry
from jobstate.models import Job
from jobstate.states import TERMINAL, Status

# Reason codes, in the order a job is classified.
CANCEL_UNHONOURED = "cancel_unhonoured"
LEASE_EXPIRED = "lease_expired"
PAST_TIMEOUT = "past_timeout"
NO_HEARTBEAT = "no_heartbeat"
QUEUED_NO_WORKER = "queued_no_worker"
RECENTLY_FAILED = "recently_failed"

# Remedy codes: what the one-click fix does (each goes through jobstate.services).
REQUEUE = "requeue"  # services.requeue: back to the queue, the old lease stops working
FORCE_CANCEL = "force_cancel"  # services.cancel_now on behalf of the lost worker
RETRY = "retry"  # services.retry: a new job linked to the failed one
START_WORKER = "start_worker"  # a worker must serve the kind; or cancel the job (the admin's click)

OPERATOR_FAILED = "OperatorFailed"


def _seconds(name: str) -> timedelta:
    return timedelta(seconds=float(conf.get(name)))


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    return f"{timesince(moment, now)} ago" if moment <= now else "in the future"


class Context:
    """Per-call values shared by the reasons: the time, and (lazily) which kinds a
    worker is serving right now."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or timezone.now()
        self._served: frozenset[str] | None = None
        self._unserved: list[str] | None = None

    @property
    def served_kinds(self) -> frozenset[str]:
        if self._served is None:
            self._served = served_kinds(self.now)
        return self._served

    @property
    def unserved_kinds(self) -> list[str]:
        """Stored kinds that no worker is visibly serving (usually none)."""
        if self._unserved is None:
            self._unserved = sorted(set(distinct_values(Job, "kind")) - self.served_kinds)
        return self._unserved


def distinct_values(model: type[Model], column: str, limit: int = 200, using: str = "default") -> list[Any]:
    """Distinct non-null values of an indexed column, hopping through its index
    (one index probe per value instead of a scan of every row)."""
    connection = connections[using]
    qn = connection.ops.quote_name
    table, col = qn(model._meta.db_table), qn(column)
    sql = (
        f"WITH RECURSIVE v(x) AS ("
        f" SELECT MIN({col}) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({col}) FROM {table} WHERE {col} > v.x) FROM v WHERE v.x IS NOT NULL"
        f") SELECT x FROM v WHERE x IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


def timeouts() -> tuple[dict[str, float], float]:
    """(per-kind handler timeouts, the default for every other kind), seconds."""
    custom = {name: float(spec.timeout) for name, spec in registry.all_handlers().items() if spec.timeout}
    return custom, float(conf.get("DEFAULT_TIMEOUT"))


def timeout_for(kind: str) -> float:
    custom, default = timeouts()
    return custom.get(kind, default)


def served_kinds(now: datetime | None = None) -> frozenset[str]:
    """Kinds a worker is visibly serving: a job of that kind is running with a fresh
    heartbeat, or one finished within the queued-past-due window."""
    now = now or timezone.now()
    fresh = now - _seconds("STUCK_NO_HEARTBEAT_SECONDS")
    window = now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    running = Job.objects.filter(status=Status.PROCESSING, heartbeat_at__gte=fresh)
    finished = Job.objects.filter(status__in=TERMINAL, finished_at__gte=window)
    kinds: set[str] = set()
    for qs in (running, finished):
        kinds.update(qs.order_by().values_list("kind", flat=True).distinct())
    return frozenset(kinds)


# --- the reasons --------------------------------------------------------------


# Each query below is exclusive on its own: it restates, as positive and
# index-friendly conditions, that no earlier reason applies (a NOT around an
# earlier reason would make PostgreSQL read every processing row).


def _cancel_limit(ctx: Context) -> datetime:
    return ctx.now - _seconds("STUCK_CANCEL_UNHONOURED_SECONDS")


def _no_pending_cancel(ctx: Context) -> Q:
    return Q(cancel_requested_at__isnull=True) | Q(cancel_requested_at__gte=_cancel_limit(ctx))


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
    return Q(status=Status.PROCESSING, cancel_requested_at__lt=_cancel_limit(ctx))


def _is_cancel_unhonoured(job: Job, ctx: Context) -> bool:
    return (
        job.status == Status.PROCESSING
        and job.cancel_requested_at is not None
        and job.cancel_requested_at < _cancel_limit(ctx)
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
    limit = ctx.now - _seconds("STUCK_NO_HEARTBEAT_SECONDS")
    return job.status == Status.PROCESSING and job.heartbeat_at is not None and job.heartbeat_at < limit


def _q_queued_no_worker(ctx: Context) -> Q:
    # Positive on the (few, usually zero) unserved kinds, so the (kind, status)
    # index answers it; with none, the filter matches nothing without a query.
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return Q(status=Status.QUEUED, run_after__lt=due, kind__in=ctx.unserved_kinds)


def _is_queued_no_worker(job: Job, ctx: Context) -> bool:
    due = ctx.now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    return job.status == Status.QUEUED and job.run_after < due and job.kind not in ctx.served_kinds


def _q_recently_failed(ctx: Context) -> Q:
    since = ctx.now - _seconds("STUCK_RECENT_FAILURE_SECONDS")
    retried = Exists(Job.objects.filter(retry_of=OuterRef("pk")))
    return Q(status=Status.FAILED, finished_at__gte=since) & ~Q(error_type=OPERATOR_FAILED) & ~Q(retried)


def _is_recently_failed(job: Job, ctx: Context) -> bool:
    since = ctx.now - _seconds("STUCK_RECENT_FAILURE_SECONDS")
    return (
        job.status == Status.FAILED
        and job.finished_at is not None
        and job.finished_at >= since
        and job.error_type != OPERATOR_FAILED
        and not Job.objects.filter(retry_of=job.pk).exists()
    )


@dataclass(frozen=True)
class Reason:
    code: str
    title: str
    remedy: str
    remedy_text: str
    query: Callable[[Context], Q]
    check: Callable[[Job, Context], bool]
    describe: Callable[[Job, Context], str]
    # How the page lists them: oldest problem first, except failures (newest first).
    order_by: tuple[str, ...]
    since_field: str
    status: str
    short: str = ""  # a few words for narrow places (list cells)


def _describe_cancel(job: Job, ctx: Context) -> str:
    return (
        f"Cancel requested {_ago(job.cancel_requested_at, ctx.now)} but the job is still processing "
        f"on worker {job.worker_id or '?'}."
    )


def _describe_lease(job: Job, ctx: Context) -> str:
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


def _describe_queued(job: Job, ctx: Context) -> str:
    return (
        f"Due {_ago(job.run_after, ctx.now)} and still queued: no worker has run a '{job.kind}' job recently."
    )


def _describe_failed(job: Job, ctx: Context) -> str:
    return (
        f"Failed {_ago(job.finished_at, ctx.now)} after attempt {job.attempts}/{job.max_attempts}: "
        f"{(job.error_message or '').strip()[:200]}"
    )


REASONS: tuple[Reason, ...] = (
    Reason(
        CANCEL_UNHONOURED,
        "Cancel requested but not honoured",
        FORCE_CANCEL,
        "Cancel it now on behalf of its worker (the worker's lease stops working).",
        _q_cancel_unhonoured,
        _is_cancel_unhonoured,
        _describe_cancel,
        ("cancel_requested_at",),
        "cancel_requested_at",
        Status.PROCESSING,
        short="cancel not honoured",
    ),
    Reason(
        LEASE_EXPIRED,
        "Lease expired (worker lost)",
        REQUEUE,
        "Requeue it (or run the reaper, which requeues every expired lease).",
        _q_lease_expired,
        _is_lease_expired,
        _describe_lease,
        ("lease_expires_at",),
        "lease_expires_at",
        Status.PROCESSING,
        short="lease expired",
    ),
    Reason(
        PAST_TIMEOUT,
        "Running past its handler's timeout",
        REQUEUE,
        "Requeue it: its worker should have stopped it; another attempt starts afresh.",
        _q_past_timeout,
        _is_past_timeout,
        _describe_timeout,
        ("started_at",),
        "started_at",
        Status.PROCESSING,
        short="past timeout",
    ),
    Reason(
        NO_HEARTBEAT,
        "No heartbeat for too long",
        REQUEUE,
        "Requeue it: the worker looks hung while its lease is still valid.",
        _q_no_heartbeat,
        _is_no_heartbeat,
        _describe_heartbeat,
        ("heartbeat_at",),
        "heartbeat_at",
        Status.PROCESSING,
        short="no heartbeat",
    ),
    Reason(
        QUEUED_NO_WORKER,
        "Queued past due, no worker serving its kind",
        START_WORKER,
        "Start a worker that serves this kind (python manage.py qcluster), or cancel the job.",
        _q_queued_no_worker,
        _is_queued_no_worker,
        _describe_queued,
        ("created_at",),  # oldest first; the (status, created_at) index serves it
        "run_after",
        Status.QUEUED,
        short="no worker for kind",
    ),
    Reason(
        RECENTLY_FAILED,
        "Failed after its last attempt",
        RETRY,
        "Retry it: a new job with the same parameters, linked to this one.",
        _q_recently_failed,
        _is_recently_failed,
        _describe_failed,
        ("-finished_at",),
        "finished_at",
        Status.FAILED,
        short="failed, not retried",
    ),
)

BY_CODE: dict[str, Reason] = {r.code: r for r in REASONS}


def reason(code: str) -> Reason:
    try:
        return BY_CODE[code]
    except KeyError:
        raise ValueError(f"Unknown stuck reason '{code}'") from None


def stuck_q(code: str, ctx: Context | None = None) -> Q:
    """The filter for jobs whose first matching reason is ``code``."""
    return reason(code).query(ctx or Context())


def any_stuck_q(ctx: Context | None = None, codes: Iterable[str] | None = None) -> Q:
    ctx = ctx or Context()
    wanted = set(codes) if codes is not None else set(BY_CODE)
    q = Q(pk__in=[])
    for r in REASONS:
        if r.code in wanted:
            q |= r.query(ctx)
    return q


@dataclass(frozen=True)
class Finding:
    job: Job
    reason: str
    title: str
    text: str
    remedy: str
    remedy_text: str
    since: datetime | None
    short: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": str(self.job.pk),
            "kind": self.job.kind,
            "status": self.job.status,
            "reason": self.reason,
            "title": self.title,
            "text": self.text,
            "remedy": self.remedy,
            "remedy_text": self.remedy_text,
            "since": self.since.isoformat() if self.since else None,
        }


def _finding(job: Job, r: Reason, ctx: Context) -> Finding:
    return Finding(
        job=job,
        reason=r.code,
        title=r.title,
        text=r.describe(job, ctx),
        remedy=r.remedy,
        remedy_text=r.remedy_text,
        since=getattr(job, r.since_field),
        short=r.short,
    )


def check(job: Job, now: datetime | None = None, *, ctx: Context | None = None) -> Finding | None:
    """Classify one loaded job: its finding, or None when it is fine."""
    ctx = ctx or Context(now)
    for r in REASONS:
        if r.check(job, ctx):
            return _finding(job, r, ctx)
    return None


def find_stuck(
    now: datetime | None = None,
    *,
    codes: Iterable[str] | None = None,
    limit: int | None = None,
    queryset: QuerySet[Job] | None = None,
    ctx: Context | None = None,
) -> list[Finding]:
    """Findings grouped by reason (in ``REASONS`` order), at most ``limit`` per reason."""
    ctx = ctx or Context(now)
    wanted = set(codes) if codes is not None else set(BY_CODE)
    limit = int(conf.get("STUCK_LIST_LIMIT")) if limit is None else limit
    base = queryset if queryset is not None else Job.objects.all()
    findings: list[Finding] = []
    for r in REASONS:
        if r.code not in wanted:
            continue
        jobs = base.filter(stuck_q(r.code, ctx)).select_related("owner").order_by(*r.order_by)
        findings.extend(_finding(job, r, ctx) for job in jobs[:limit])
    return findings


def count_stuck(
    now: datetime | None = None,
    *,
    codes: Iterable[str] | None = None,
    cap: int | None = None,
    ctx: Context | None = None,
) -> dict[str, int]:
    """How many jobs each reason holds, counting at most ``cap`` rows per reason."""
    ctx = ctx or Context(now)
    wanted = set(codes) if codes is not None else set(BY_CODE)
    cap = int(conf.get("ADMIN_COUNT_CAP")) if cap is None else cap
    return {
        r.code: Job.objects.filter(stuck_q(r.code, ctx)).order_by()[:cap].count()
        for r in REASONS
        if r.code in wanted
    }


ACTIVE_REASONS: frozenset[str] = frozenset(r.code for r in REASONS if r.code != RECENTLY_FAILED)
