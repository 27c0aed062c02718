"""Failures before a handler starts: refunded the first times, then charged.

An ``Exception`` raised before the handler is called (``begin`` failed, or the
call's set-up once ``begin`` charged the attempt) requeues the job with no attempt
charged: it is usually transient (a dropped connection) and says nothing about the
job. One that recurs every time (a task's arguments that cannot be decoded) would
requeue it for ever, ``max_attempts`` never reached. So the history row of each
says how many the job had in a row (``KEY``, this one included), and past
``JOBSTATE["SETUP_FAILURES_REFUNDED"]`` the attempt is charged: the retry policy
and ``max_attempts`` apply, and the job ends ``failed`` with the error.
"""

from __future__ import annotations

from typing import Any

from jobstate import conf
from jobstate.models import JobEvent
from jobstate.states import Status

# The history metadata key: failures before the handler started, in a row.
KEY = "setup_failures"


def in_a_row(job_id: Any) -> int:
    """How many failures before the handler started ended the job's last claims,
    in a row: what the history row that ended its last claim says (read by the
    ``(job, id)`` index, newest first; only on this rare path). A row written
    before ``KEY`` existed that says the same (its error, no attempt charged)
    counts as one."""
    metadata = (
        JobEvent.objects.filter(job_id=job_id, from_status=Status.PROCESSING)
        .exclude(to_status=Status.PROCESSING)
        .order_by("-id")
        .values_list("metadata", flat=True)
        .first()
    )
    if not isinstance(metadata, dict):
        return 0
    if KEY in metadata:
        return int(metadata[KEY])
    return 1 if metadata.get("unstarted") and "error_type" in metadata else 0


def charged(count: int) -> bool:
    """Whether the ``count``-th failure before the handler started in a row
    charges its attempt."""
    return count > int(conf.get("SETUP_FAILURES_REFUNDED"))
