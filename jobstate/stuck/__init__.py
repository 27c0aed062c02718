"""Stuck-job detection: which jobs need a person, why, and what fixes them.

One place for the admin's stuck page, the API, ``manage.py jobstate_stuck``
and monitoring. Every reason is a database filter (so lists and counts stay
cheap on large tables) plus a pure-Python check of a loaded job that agrees with
it. A job is reported once, under the first reason in ``REASONS`` it matches.
Thresholds are settings (``JOBSTATE["STUCK_*"]``, see ``jobstate.conf``).

Modules: ``codes`` (reason and remedy codes), ``context`` (time, thresholds,
served kinds), ``processing`` and ``idle`` (the reason families: jobs a worker
holds; queued, waiting and failed jobs), ``reasons`` (the ordered table),
``findings`` (find, check, count).
"""

from jobstate.stuck.codes import (
    CANCEL_UNHONOURED,
    FORCE_CANCEL,
    LEASE_EXPIRED,
    NO_HEARTBEAT,
    OPERATOR_FAILED,
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
from jobstate.stuck.context import Context, distinct_values, no_jit, served_kinds, timeout_for, timeouts
from jobstate.stuck.findings import ACTIVE_REASONS, Finding, check, count_stuck, find_stuck, survey
from jobstate.stuck.reasons import BY_CODE, REASONS, Reason, any_stuck_q, reason, stuck_q

__all__ = [
    "ACTIVE_REASONS",
    "BY_CODE",
    "CANCEL_UNHONOURED",
    "FORCE_CANCEL",
    "LEASE_EXPIRED",
    "NO_HEARTBEAT",
    "OPERATOR_FAILED",
    "PAST_TIMEOUT",
    "QUEUED_KIND_PAUSED",
    "QUEUED_NO_WORKER",
    "REASONS",
    "RECENTLY_FAILED",
    "REQUEUE",
    "RESUME_KIND",
    "RETRY",
    "START_WORKER",
    "WAITING_NO_CHILDREN",
    "Context",
    "Finding",
    "Reason",
    "any_stuck_q",
    "check",
    "count_stuck",
    "distinct_values",
    "find_stuck",
    "no_jit",
    "reason",
    "served_kinds",
    "stuck_q",
    "survey",
    "timeout_for",
    "timeouts",
]
