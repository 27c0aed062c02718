"""Who may see, start and act on what through the API (docs/reference/api-access.md).

Visibility is one rule, the admin's: active staff holding ``jobstate.view_job``
(or ``change_job``) see every job, asset and event with its users' names;
everyone else sees only their own jobs and assets (another user's job is simply
not found, a 404), and the people who acted on them appear as ``operator``.

Starting: a kind's ``api=`` policy (``jobstate.registry.handler``) says who may
enqueue it here: nobody (``False``, the default), any authenticated user
(``True``) or holders of a permission (``"app.codename"``).

Acting on a visible job: its owner may cancel it, and retry it when they may
start its kind; staff may do so to other people's jobs when they hold the
matching model permission (``jobstate.cancel_job``, ``jobstate.retry_job``).
The operator remedies (requeue a processing job, fail a job with a reason) need
``jobstate.requeue_job`` and staff status, whoever owns the job, as in the admin.

Pausing and resuming a kind (``POST /kinds/{name}/pause/``, ``.../resume/``) changes
what every worker claims, whoever owns the jobs: active staff holding
``jobstate.change_job``, as the admin's Pause and Resume require. Everyone sees
whether a kind they may start is paused and since when; the reason and who paused
it only those who may view all jobs.

Priority: an enqueue's ``priority`` is capped by ``JOBSTATE["API_MAX_PRIORITY"]``,
but for staff holding ``jobstate.change_job`` (any in the column's range).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import QuerySet
from rest_framework.permissions import BasePermission

from jobstate import conf, registry
from jobstate.models import Asset, Job
from jobstate.models.job import VIEW_ALL_PERMISSIONS as VIEW_ALL_PERMISSIONS
from jobstate.models.job import may_view_all as may_view_all
from jobstate.models.job import was_retried
from jobstate.services import operator_actions
from jobstate.states import Status

ACTION_PERMISSIONS = {
    "cancel": "jobstate.cancel_job",
    "retry": "jobstate.retry_job",
    "requeue": "jobstate.requeue_job",
    "fail": "jobstate.requeue_job",
}
OPERATOR_ACTIONS = frozenset({"requeue", "fail"})
OPERATOR = "operator"  # how owners see the other people who acted on their jobs


def visible_jobs(user: Any) -> QuerySet[Job]:
    if may_view_all(user):
        return Job.objects.all()
    if not getattr(user, "is_authenticated", False):
        return Job.objects.none()
    return Job.objects.filter(owner=user)


def visible_assets(user: Any) -> QuerySet[Asset]:
    """The assets ``user`` may read: their own (everyone's for staff), without those
    of lost attempts, as a job's own asset list shows them (``Asset.objects.visible``)."""
    if not getattr(user, "is_authenticated", False):
        return Asset.objects.none()
    assets = Asset.objects.visible()
    return assets if may_view_all(user) else assets.filter(owner=user)


def may_start(user: Any, spec: registry.HandlerSpec) -> bool:
    """Whether ``user`` may enqueue ``spec``'s kind through the API."""
    if not getattr(user, "is_authenticated", False) or spec.api is False:
        return False
    if spec.api is True:
        return True
    return bool(user.has_perm(spec.api))


def may_start_kind(user: Any, kind: str) -> bool:
    spec = registry.all_handlers().get(kind)
    return spec is not None and may_start(user, spec)


def startable_kinds(user: Any) -> list[registry.HandlerSpec]:
    return [spec for _, spec in sorted(registry.all_handlers().items()) if may_start(user, spec)]


PAUSE_PERMISSION = "jobstate.change_job"


def may_pause_kinds(user: Any) -> bool:
    """Whether ``user`` may pause and resume kinds: active staff with ``PAUSE_PERMISSION``."""
    if not (getattr(user, "is_staff", False) and getattr(user, "is_active", False)):
        return False
    return bool(user.has_perm(PAUSE_PERMISSION))


def max_priority(user: Any) -> int | None:
    """The highest ``priority`` ``user`` may send to ``POST /jobs/`` (None: the column's)."""
    if getattr(user, "is_staff", False) and user.has_perm("jobstate.change_job"):
        return None
    return int(conf.get("API_MAX_PRIORITY"))


def may_act(user: Any, job: Job, action: str) -> bool:
    if (
        action not in OPERATOR_ACTIONS
        and job.owner_id is not None
        and job.owner_id == getattr(user, "pk", None)
        # A retry enqueues the kind again: only if the owner may start it.
        and (action != "retry" or may_start_kind(user, job.kind))
    ):
        return True
    return bool(getattr(user, "is_staff", False) and user.has_perm(ACTION_PERMISSIONS[action]))


@functools.cache
def _accepted(status: str) -> frozenset[str]:
    # The FSM declarations do not change at run time; lists serialize many rows.
    return operator_actions(status)


def possible_actions(job: Job) -> list[str]:
    """What the job's state allows now, whoever asks: what the services accept
    (``services.operator_actions``), but a second cancel of a processing job and a
    second retry of a job."""
    accepted = _accepted(job.status)
    asked = job.status == Status.PROCESSING and job.cancel_requested_at is not None
    return [
        action
        for action in ("cancel", "retry", "requeue", "fail")
        if action in accepted
        and not (action == "cancel" and asked)
        # A job is retried once (services.retry refuses a second: AlreadyRetried).
        and not (action == "retry" and was_retried(job))
    ]


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


class CanPauseKinds(BasePermission):
    """View permission of the pause and resume actions: checked before the kind is
    looked up, so that nobody else learns which kinds exist (a 403 for any name)."""

    message = "Pausing and resuming kinds needs staff status and the jobstate.change_job permission."

    def has_permission(self, request: Any, view: Any) -> bool:
        return may_pause_kinds(request.user)
