"""jobstate's settings, all under one ``JOBSTATE`` dict.

Values are read on every access, so ``override_settings(JOBSTATE={...})``
works in tests.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Seconds a claim is valid without a heartbeat.
    "LEASE_SECONDS": 60,
    # Seconds between background heartbeats while a handler runs.
    "HEARTBEAT_SECONDS": 10,
    "DEFAULT_MAX_ATTEMPTS": 3,
    # Per-attempt timeout for handlers that do not set one (seconds).
    "DEFAULT_TIMEOUT": 600,
    # Retry backoff: base * 2 ** (attempt - 1), capped, plus up to JITTER of it.
    "RETRY_BACKOFF_BASE": 5.0,
    "RETRY_BACKOFF_MAX": 3600.0,
    "RETRY_JITTER": 0.25,
    # Seconds a handler may ignore a cancel request before it is stopped.
    "CANCEL_GRACE_SECONDS": 30,
    # How many jobs a worker claims at once.
    "CLAIM_BATCH": 10,
    # django-q2 workers (jobstate.worker.broker.JobBroker): jobs claimed but not yet
    # started per cluster (None: about PREFETCH_SECONDS of work at the observed pick-up
    # rate, from one per worker process up to two claim batches); seconds between the
    # broker's own reaper passes (0 turns them off; the scheduled reaper still runs);
    # slack past timeout + cancel grace before django-q2 kills a worker that ignores
    # every stop. An idle broker waits Q_CLUSTER["poll"] seconds (PostgreSQL: LISTEN/NOTIFY
    # wakes it).
    "PREFETCH": None,
    "PREFETCH_SECONDS": 0.5,
    "REAP_INTERVAL_SECONDS": 15,
    "HARD_KILL_MARGIN_SECONDS": 30,
    # Seconds a worker process keeps its database connection between jobs, even
    # with CONN_MAX_AGE=0 (None: follow CONN_MAX_AGE).
    "WORKER_CONN_MAX_AGE": 300,
    # Retention: pruning deletes this many finished jobs per transaction.
    "PRUNE_BATCH": 500,
    # Finished jobs older than this many days are pruned (None keeps them).
    "RETENTION_DAYS": 30,
    # Largest accepted ``parameters`` payload, in bytes of JSON.
    "MAX_PARAMETERS_BYTES": 64 * 1024,
    # Storage alias for asset files.
    "STORAGE": "default",
    # REST API: an SSE progress stream ends after this many seconds (clients reconnect),
    # polling the database every SSE_POLL_SECONDS and sending a keep-alive comment
    # every SSE_KEEPALIVE_SECONDS; a long-poll ``?wait=`` is capped at LONGPOLL_MAX_SECONDS.
    "SSE_MAX_SECONDS": 300,
    "SSE_POLL_SECONDS": 1.0,
    "SSE_KEEPALIVE_SECONDS": 15,
    "LONGPOLL_MAX_SECONDS": 30,
    # Streams and long-polls one user may hold open at once (None: no limit).
    "API_MAX_STREAMS_PER_USER": 5,
    # Largest accepted API request body in bytes (JSON); larger bodies get a 413.
    "API_MAX_BODY_BYTES": 1024 * 1024,
    # Stuck-job thresholds (seconds).
    "STUCK_NO_HEARTBEAT_SECONDS": 120,
    "STUCK_QUEUED_PAST_DUE_SECONDS": 300,
    "STUCK_CANCEL_UNHONOURED_SECONDS": 120,
    "STUCK_RECENT_FAILURE_SECONDS": 24 * 3600,
    # Workflows: default checkpoint interval of ctx.iterate / ctx.batches (items), and
    # how often a serving step's ctx.wait_for_stop() looks at the database (seconds).
    "WORKFLOW_BATCH": 100,
    "WORKFLOW_POLL_SECONDS": 1.0,
    # Slack past a handler's timeout before a still-processing job counts as stuck.
    "STUCK_TIMEOUT_GRACE_SECONDS": 60,
    # Jobs listed per reason on the stuck page (the list links to the rest).
    "STUCK_LIST_LIMIT": 25,
    # A worker counts as alive on the dashboard if it heartbeat this recently.
    "WORKER_ALIVE_SECONDS": 120,
    # Lists in the admin never COUNT more rows than this (estimates above it).
    "ADMIN_COUNT_CAP": 10_000,
}


def get(name: str) -> Any:
    user = getattr(settings, "JOBSTATE", {}) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]
