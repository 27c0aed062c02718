"""The service layer: the only code that changes job state.

Admin, API, workers and commands call these functions; each change is a
conditional UPDATE plus its JobEvent in one transaction.
"""

from jobstate.services.actors import Actor
from jobstate.services.assets import (
    add_asset,
    file_response,
    result_assets,
    safe_name,
)
from jobstate.services.bulk import Child, checked_child, enqueue_children, enqueue_many
from jobstate.services.control import (
    DuplicateActiveKey,
    cancel_now,
    force_cancel,
    force_fail,
    hand_back,
    operator_actions,
    request_cancel,
    request_stop,
    requeue,
    suspend,
)
from jobstate.services.enqueue import (
    check_job,
    enqueue,
    get_or_enqueue,
    key_problem,
)
from jobstate.services.handover import NextClaim
from jobstate.services.lease import (
    Beat,
    Begun,
    begin,
    claim,
    extend_leases,
    heartbeat,
    progress_fields,
    report_progress,
    start,
)
from jobstate.services.orphans import OrphanSweep, remove_orphan_files, sweep_orphan_files
from jobstate.services.outcomes import complete, fail, fail_held, mark_partial
from jobstate.services.pauses import pause_kind, paused_kinds, resume_kind
from jobstate.services.reaper import ReapReport, requeue_expired
from jobstate.services.retries import retry
from jobstate.services.steps import all_step_transitions, move_step
from jobstate.services.transitions import all_transitions, allowed_transitions, lock_parent, parent_locked

__all__ = [
    "Actor",
    "Beat",
    "Begun",
    "Child",
    "DuplicateActiveKey",
    "NextClaim",
    "OrphanSweep",
    "ReapReport",
    "add_asset",
    "all_step_transitions",
    "all_transitions",
    "allowed_transitions",
    "begin",
    "cancel_now",
    "check_job",
    "checked_child",
    "claim",
    "complete",
    "enqueue",
    "enqueue_children",
    "enqueue_many",
    "extend_leases",
    "fail",
    "fail_held",
    "file_response",
    "force_cancel",
    "force_fail",
    "get_or_enqueue",
    "hand_back",
    "heartbeat",
    "key_problem",
    "lock_parent",
    "mark_partial",
    "move_step",
    "operator_actions",
    "parent_locked",
    "pause_kind",
    "paused_kinds",
    "progress_fields",
    "remove_orphan_files",
    "report_progress",
    "request_cancel",
    "request_stop",
    "requeue",
    "requeue_expired",
    "result_assets",
    "resume_kind",
    "retry",
    "safe_name",
    "start",
    "suspend",
    "sweep_orphan_files",
]
