"""Who may do what to a job through the API.

Visibility is decided by the queryset (``Job.objects.owned_by``): another
user's job is simply not found. Acting on a visible job: its owner may cancel
and retry it; staff may do so to other people's jobs when they hold the
matching model permission (``jobstate.cancel_job``, ``jobstate.retry_job``).
The operator remedies (requeue a processing job, fail a job with a reason) need
``jobstate.requeue_job`` and staff status, whoever owns the job, as in the admin.
"""

from __future__ import annotations

import functools
from typing import Any

from rest_framework.permissions import BasePermission

from jobstate.models import Job
from jobstate.services import allowed_transitions
from jobstate.states import TERMINAL, Status

ACTION_PERMISSIONS = {
    "cancel": "jobstate.cancel_job",
    "retry": "jobstate.retry_job",
    "requeue": "jobstate.requeue_job",
    "fail": "jobstate.requeue_job",
}
OPERATOR_ACTIONS = frozenset({"requeue", "fail"})


def may_act(user: Any, job: Job, action: str) -> bool:
    if (
        action not in OPERATOR_ACTIONS
        and job.owner_id is not None
        and job.owner_id == getattr(user, "pk", None)
    ):
        return True
    return bool(getattr(user, "is_staff", False) and user.has_perm(ACTION_PERMISSIONS[action]))


@functools.cache
def _transitions(status: str) -> frozenset[str]:
    # The FSM declarations do not change at run time; lists serialize many rows.
    return frozenset(allowed_transitions(status))


def possible_actions(job: Job) -> list[str]:
    """What the job's state allows now, whoever asks."""
    moves = _transitions(job.status)
    actions = []
    if "cancel" in moves and not (job.status == Status.PROCESSING and job.cancel_requested_at is not None):
        actions.append("cancel")
    if job.status in TERMINAL:
        actions.append("retry")
    if "requeue" in moves:
        actions.append("requeue")
    if "fail" in moves:
        actions.append("fail")
    return actions


def allowed_actions(user: Any, job: Job) -> list[str]:
    """What ``user`` may do to ``job`` now: the state allows it and so do their rights."""
    return [action for action in possible_actions(job) if may_act(user, job, action)]


class CanActOnJob(BasePermission):
    """Object permission for the ``cancel``, ``retry``, ``requeue`` and ``fail`` actions."""

    message = "You do not have permission to do this to this job."

    def has_object_permission(self, request: Any, view: Any, obj: Any) -> bool:
        action = getattr(view, "action", None)
        if action not in ACTION_PERMISSIONS:
            return True
        return may_act(request.user, obj, action)
