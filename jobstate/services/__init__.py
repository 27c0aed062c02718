"""The service layer: the only code that changes job state.

Admin, API, workers and commands call these functions; each change is a
conditional UPDATE plus its JobEvent in one transaction.
"""

from jobstate.services.actors import Actor
from jobstate.services.assets import add_asset, safe_name
from jobstate.services.control import (
    DuplicateActiveKey,
    ReapReport,
    cancel_now,
    force_fail,
    request_cancel,
    request_stop,
    requeue,
    requeue_expired,
    retry,
    suspend,
)
from jobstate.services.enqueue import enqueue, enqueue_many, get_or_enqueue
from jobstate.services.lease import Beat, claim, extend_leases, heartbeat, report_progress, start
from jobstate.services.outcomes import complete, fail, mark_partial
from jobstate.services.transitions import all_transitions, allowed_transitions

__all__ = [
    "Actor",
    "Beat",
    "DuplicateActiveKey",
    "ReapReport",
    "add_asset",
    "all_transitions",
    "allowed_transitions",
    "cancel_now",
    "claim",
    "complete",
    "enqueue",
    "enqueue_many",
    "extend_leases",
    "fail",
    "force_fail",
    "get_or_enqueue",
    "heartbeat",
    "mark_partial",
    "report_progress",
    "request_cancel",
    "request_stop",
    "requeue",
    "requeue_expired",
    "retry",
    "safe_name",
    "start",
    "suspend",
]
