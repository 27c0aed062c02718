"""The stuck reasons, in classification order: each a database filter plus a
pure-Python check of a loaded job that agrees with it, a description and a remedy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db.models import Q

from jobstate.models import Job
from jobstate.states import Status
from jobstate.stuck.codes import (
    CANCEL_UNHONOURED,
    FORCE_CANCEL,
    LEASE_EXPIRED,
    NO_HEARTBEAT,
    PAST_TIMEOUT,
    QUEUED_KIND_PAUSED,
    QUEUED_NO_WORKER,
    RECENTLY_FAILED,
    REQUEUE,
    RESUME_KIND,
    RETRY,
    START_WORKER,
    WAITING_NO_CHILDREN,
)
from jobstate.stuck.context import Context
from jobstate.stuck.idle import (
    _describe_failed,
    _describe_paused,
    _describe_queued,
    _describe_waiting,
    _is_queued_kind_paused,
    _is_queued_no_worker,
    _is_recently_failed,
    _is_waiting_no_children,
    _q_queued_kind_paused,
    _q_queued_no_worker,
    _q_recently_failed,
    _q_waiting_no_children,
)
from jobstate.stuck.processing import (
    _describe_cancel,
    _describe_heartbeat,
    _describe_lease,
    _describe_timeout,
    _is_cancel_unhonoured,
    _is_lease_expired,
    _is_no_heartbeat,
    _is_past_timeout,
    _q_cancel_unhonoured,
    _q_lease_expired,
    _q_no_heartbeat,
    _q_past_timeout,
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
        "Requeue it: its worker should have stopped it; another attempt starts afresh once its "
        "lease would have run out (the worker's watchdog stops it by then).",
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
        "Requeue it: the worker looks hung while its lease is still valid; another attempt starts "
        "once its lease would have run out (the worker's watchdog stops it by then).",
        _q_no_heartbeat,
        _is_no_heartbeat,
        _describe_heartbeat,
        ("heartbeat_at",),
        "heartbeat_at",
        Status.PROCESSING,
        short="no heartbeat",
    ),
    Reason(
        QUEUED_KIND_PAUSED,
        "Queued past due, its kind paused",
        RESUME_KIND,
        "Resume the kind (the Resume button of its pause on the admin dashboard, or python manage.py "
        "jobstate resume KIND) once what it was paused for is over.",
        _q_queued_kind_paused,
        _is_queued_kind_paused,
        _describe_paused,
        ("created_at",),
        "run_after",
        Status.QUEUED,
        short="kind paused",
    ),
    Reason(
        QUEUED_NO_WORKER,
        "Queued past due, no worker serving its kind",
        START_WORKER,
        "Start a worker that serves this kind (python manage.py qcluster), or cancel the job "
        "(its handler or task may have been renamed or removed from the code). A django.tasks task "
        "is known to workers only in an installed app's tasks module or a module the backend's "
        "OPTIONS['MODULES'] lists.",
        _q_queued_no_worker,
        _is_queued_no_worker,
        _describe_queued,
        ("created_at",),  # oldest first; the (status, created_at) index serves it
        "run_after",
        Status.QUEUED,
        short="no worker for kind",
    ),
    Reason(
        WAITING_NO_CHILDREN,
        "Waiting for children that have all ended",
        REQUEUE,
        "Wake it: it runs again now and sums up its children.",
        _q_waiting_no_children,
        _is_waiting_no_children,
        _describe_waiting,
        ("updated_at",),
        "updated_at",
        Status.WAITING,
        short="waiting, no child left",
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
