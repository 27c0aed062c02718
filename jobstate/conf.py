"""jobstate's settings, all under one ``JOBSTATE`` dict: their defaults, how they
are read, and the values each key takes (``manage.py check`` reports the rest:
``jobstate.settings_checks``).

Values are read on every access, so ``override_settings(JOBSTATE={...})``
works in tests.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings

# The most runs a job may have: enqueue, handler and task options and the settings
# that give a job its max_attempts all keep to it (a registration or a setting above
# it made jobs that enqueue's own max_attempts= refused).
MAX_ATTEMPTS_LIMIT = 1000

# The range of a job's priority (its column is a smallint).
PRIORITY_RANGE = (-32768, 32767)

DEFAULTS: dict[str, Any] = {
    # Seconds a claim is valid without a heartbeat.
    "LEASE_SECONDS": 60,
    # Seconds between background heartbeats while a handler runs.
    "HEARTBEAT_SECONDS": 10,
    # Runs of a job (the first one counts; 1 to 1000) for handlers that do not set max_attempts.
    "DEFAULT_MAX_ATTEMPTS": 3,
    # Failures before a handler starts (begin fails, or its call's set-up) in a row that
    # are refunded (requeued, no attempt charged: a dropped connection says nothing about
    # the job); past it each one is charged, so that one that recurs every time ends
    # ``failed`` at max_attempts instead of requeuing the job for ever. 0 charges every one.
    "SETUP_FAILURES_REFUNDED": 5,
    # Per-attempt timeout for handlers that do not set one (seconds).
    "DEFAULT_TIMEOUT": 600,
    # Retry backoff: base * 2 ** (attempt - 1) seconds, capped at max (not below base),
    # plus up to JITTER (a fraction, 0 to 1) of it.
    "RETRY_BACKOFF_BASE": 5.0,
    "RETRY_BACKOFF_MAX": 3600.0,
    "RETRY_JITTER": 0.25,
    # Seconds a handler may ignore a cancel request before it is stopped.
    "CANCEL_GRACE_SECONDS": 30,
    # Seconds a handler has to honour its interrupt (timeout, cancel grace over, lease
    # lost) before its worker gives it up: its lease no longer renewed, the interrupt's
    # outcome recorded, and a django-q2 worker process ended (django-q2 replaces it).
    # Long enough for a handler to unwind (a query in flight delays the interrupt);
    # keep it below CANCEL_GRACE_SECONDS + HARD_KILL_MARGIN_SECONDS, or django-q2's
    # hard limit ends the process first and the reaper records WorkerLost.
    "INTERRUPT_GRACE_SECONDS": 30,
    # ctx.progress() writes at most once per this many seconds (the latest value wins;
    # the last one is stored with the outcome). 0 writes every call.
    "PROGRESS_FLUSH_SECONDS": 0.25,
    # django-q2 workers (jobstate.worker.broker.JobBroker): jobs claimed but not yet
    # started per cluster (None: one per idle worker process; a busy one claims its
    # next job itself as it ends one, for up to WORKER_CHAIN_SECONDS before it returns
    # to django-q2; 0 turns that off); seconds between the
    # broker's own reaper passes (0 turns them off; the scheduled reaper still runs);
    # slack past timeout + cancel grace before django-q2 kills a worker that ignores
    # every stop. An idle broker waits Q_CLUSTER["poll"] seconds (PostgreSQL: LISTEN/NOTIFY
    # wakes it).
    "PREFETCH": None,
    "WORKER_CHAIN_SECONDS": 2.0,
    "REAP_INTERVAL_SECONDS": 15,
    "HARD_KILL_MARGIN_SECONDS": 30,
    # Seconds a worker process keeps its database connection between jobs, even
    # with CONN_MAX_AGE=0 (None: follow CONN_MAX_AGE).
    "WORKER_CONN_MAX_AGE": 300,
    # Retention: pruning deletes this many finished jobs per transaction. The scheduled
    # daily prune stops between batches after PRUNE_MAX_SECONDS (keep it well below
    # Q_CLUSTER["timeout"], which kills a longer run: jobstate.W014); its result then
    # says "more", and the next run goes on. The old webhook delivery records, the
    # orphan-file sweep and the metrics' fold of the history it deletes go first, each
    # within a fifth of it, so that a backlog of jobs cannot starve them. jobstate_prune
    # runs until done unless given --max-seconds.
    "PRUNE_BATCH": 500,
    "PRUNE_MAX_SECONDS": 240,
    # Finished jobs older than this many days are pruned (None keeps them), and so are the
    # webhook delivery records and the records of kind pauses resumed that long ago.
    "RETENTION_DAYS": 30,
    # Largest accepted ``parameters`` payload, in bytes of JSON.
    "MAX_PARAMETERS_BYTES": 64 * 1024,
    # Largest result (and workflow step output) stored, in bytes of JSON: a larger one
    # fails the job for good (UnstorableResult), as one the database refuses would be
    # re-run. Larger outputs belong in a file: ctx.add_asset().
    "MAX_RESULT_BYTES": 16 * 1024 * 1024,
    # Storage alias for asset files.
    "STORAGE": "default",
    # REST API: an SSE progress stream ends after this many seconds (clients reconnect),
    # polling the database every SSE_POLL_SECONDS and sending a keep-alive comment
    # every SSE_KEEPALIVE_SECONDS; a long-poll ``?wait=`` is capped at LONGPOLL_MAX_SECONDS.
    "SSE_MAX_SECONDS": 300,
    "SSE_POLL_SECONDS": 0.5,
    "SSE_KEEPALIVE_SECONDS": 15,
    "LONGPOLL_MAX_SECONDS": 30,
    # Streams and long-polls one user may hold open at once (None: no limit).
    "API_MAX_STREAMS_PER_USER": 5,
    # Largest accepted API request body in bytes (JSON); larger bodies get a 413.
    "API_MAX_BODY_BYTES": 1024 * 1024,
    # Highest ``priority`` a caller may send to POST /api/jobs/ (-32768 to 32767; a higher
    # one is a 400): a user's jobs cannot jump every other user's queue. Staff holding
    # jobstate.change_job may send any, as code may (services.enqueue); negative ones
    # (run later) are always accepted.
    "API_MAX_PRIORITY": 0,
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
    # Webhooks -------------------------------------------------------------
    # Deliver to private, loopback, link-local, reserved or multicast addresses
    # (checked after DNS resolution). Off by default: a user-supplied URL must
    # not reach the intranet or the cloud metadata service.
    "WEBHOOK_ALLOW_PRIVATE": False,
    # Seconds a whole delivery request may take (connecting, sending, the answer), in all.
    "WEBHOOK_TIMEOUT": 5.0,
    # Bytes of the receiver's response read (and kept, up to 1 KiB) at most.
    "WEBHOOK_MAX_RESPONSE_BYTES": 64 * 1024,
    # Attempts per delivery (1 to 1000), and the backoff between them: base * 2 ** (attempt - 1)
    # seconds, capped at max, plus up to 25% jitter.
    "WEBHOOK_MAX_ATTEMPTS": 8,
    "WEBHOOK_BACKOFF_BASE": 10.0,
    "WEBHOOK_BACKOFF_MAX": 6 * 3600.0,
    # An endpoint is disabled after this many failed attempts in a row (any
    # delivery); its owner sees why and re-enables it.
    "WEBHOOK_DISABLE_AFTER": 20,
    # Seconds the previous secret keeps signing after a rotation.
    "WEBHOOK_SECRET_OVERLAP_SECONDS": 24 * 3600,
    # Seconds a process trusts its "which events does anyone want?" answer; an
    # endpoint saved in the same process refreshes it at once.
    "WEBHOOK_CACHE_SECONDS": 2.0,
    # Metrics ---------------------------------------------------------------
    # Who may scrape /metrics/: "token" (Authorization: Bearer METRICS_TOKEN),
    # "staff" (a logged-in staff user; the token works too) or "open".
    "METRICS_ACCESS": "staff",
    "METRICS_TOKEN": "",
    # Seconds the gauges (one grouped query each) are served from memory before a
    # refresh; a refresh runs in a background thread while the old values are served.
    "METRICS_CACHE_SECONDS": 10.0,
    # History rows newer than this many seconds are not yet folded into the stored
    # totals, so the counters lag by that much (a transaction that commits that late
    # keeps its row).
    "METRICS_SETTLE_SECONDS": 10.0,
    # History rows folded into the stored totals per scrape at most (a first
    # scrape of a large database catches up over several scrapes).
    "METRICS_FOLD_BATCH": 50_000,
    # Tracing ---------------------------------------------------------------
    # Trace jobs when opentelemetry-api is installed (None: whenever it is).
    "TRACING": None,
    # Send free text and user names in spans: ``jobstate.reason`` (an attempt's exception
    # message, an operator's reason; also a failed span's error description) and the
    # username in ``jobstate.actor`` ("user:<username>"; without it, "user").
    "TRACING_SENSITIVE_ATTRIBUTES": False,
}


def get(name: str) -> Any:
    user = getattr(settings, "JOBSTATE", {}) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]


# --- the values each key takes (checked by jobstate.settings_checks) --------------
#
# The accepted types of each key derive from its default: a bool default takes a
# bool, an int default an int, a float default an int or a float, a str default a
# str; a ``*_SECONDS`` key also takes a float. Keys that may be None (or whose
# default is None) are listed here with the types they take besides None; a key
# added to DEFAULTS with a None default must be added here too (a test checks it).
NULLABLE: dict[str, tuple[type, ...]] = {
    "PREFETCH": (int,),
    "WORKER_CONN_MAX_AGE": (int, float),
    "RETENTION_DAYS": (int, float),
    "API_MAX_STREAMS_PER_USER": (int,),
    "TRACING": (bool,),
}


# Numbers of seconds whose names do not end in _SECONDS: an int or a float, as a
# handler's own ``timeout=``.
SECONDS = frozenset(
    {
        "DEFAULT_TIMEOUT",
        "WEBHOOK_TIMEOUT",
        "WORKER_CONN_MAX_AGE",
        "RETRY_BACKOFF_BASE",
        "RETRY_BACKOFF_MAX",
        "WEBHOOK_BACKOFF_BASE",
        "WEBHOOK_BACKOFF_MAX",
    }
)

# Every number of seconds is finite and greater than 0 (E009): 0 or less ended a lease,
# a request or a stream at once, or made a loop poll without pause; infinity or NaN
# raised where a time is computed from it, or waited for ever. These take 0 too: it
# turns something off, or writes, flags or refreshes at every call.
SECONDS_FROM_ZERO = frozenset(
    {
        "CANCEL_GRACE_SECONDS",
        "PROGRESS_FLUSH_SECONDS",
        "WORKER_CHAIN_SECONDS",
        "REAP_INTERVAL_SECONDS",
        "HARD_KILL_MARGIN_SECONDS",
        "LONGPOLL_MAX_SECONDS",
        "STUCK_NO_HEARTBEAT_SECONDS",
        "STUCK_QUEUED_PAST_DUE_SECONDS",
        "STUCK_CANCEL_UNHONOURED_SECONDS",
        "STUCK_RECENT_FAILURE_SECONDS",
        "STUCK_TIMEOUT_GRACE_SECONDS",
        "WEBHOOK_SECRET_OVERLAP_SECONDS",
        "WEBHOOK_CACHE_SECONDS",
        "METRICS_CACHE_SECONDS",
        "METRICS_SETTLE_SECONDS",
        "WORKER_CONN_MAX_AGE",
        "RETRY_BACKOFF_BASE",
        "RETRY_BACKOFF_MAX",
        "WEBHOOK_BACKOFF_BASE",
        "WEBHOOK_BACKOFF_MAX",
    }
)


def is_seconds(name: str) -> bool:
    """Whether ``JOBSTATE[name]`` is a number of seconds (E009 checks its range)."""
    return name.endswith("_SECONDS") or name in SECONDS


def seconds_in_range(name: str, value: Any) -> bool:
    if not is_seconds(name) or value is None:
        return True
    least_ok = value >= 0 if name in SECONDS_FROM_ZERO else value > 0
    return math.isfinite(value) and least_ok  # NaN is not finite


def allowed_types(name: str) -> tuple[type, ...]:
    """The types ``JOBSTATE[name]`` may have (``type(None)`` when it may be None)."""
    if name in NULLABLE:
        return (*NULLABLE[name], type(None))
    default = DEFAULTS[name]
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, float) or (
        isinstance(default, int) and (name.endswith("_SECONDS") or name in SECONDS)
    ):
        return (int, float)
    if default is None:
        return (object,)  # undeclared: see NULLABLE
    return (type(default),)


# Every system check's hint ends with this (the page lists each check id).
CHECKS_DOCS = "See docs/reference/checks.md in the jobstate documentation."


def accepts(types: tuple[type, ...], value: Any) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, not a number of seconds to us
    return isinstance(value, types)


def well_typed(*names: str) -> bool:
    """Whether these settings have types ``check_settings`` accepts (and, for numbers
    of seconds, values in range): a check that computes with them leaves a wrong
    type to E003 and a number of seconds out of range to E009 rather than crashing
    ``check``."""
    return all(
        accepts(allowed_types(name), get(name)) and seconds_in_range(name, get(name)) for name in names
    )


# The least value a numeric key takes (E005): of the right type, a smaller one would
# break what reads it.
MINIMUM: dict[str, float] = {
    "PRUNE_BATCH": 1,  # 0 made every prune loop for ever, less than 0 raised
    "MAX_RESULT_BYTES": 1,  # 0 refused every result
    "ADMIN_COUNT_CAP": 1,  # 0 counted no stuck job (jobstate_stuck exited 0), less than 0 raised
    "RETENTION_DAYS": 0,  # the daily prune raised
    "SETUP_FAILURES_REFUNDED": 0,  # less than 0 acts as 0 (every failure before the handler charged)
    "DEFAULT_MAX_ATTEMPTS": 1,  # an enqueue of a kind without its own max_attempts failed in the database
    "WEBHOOK_MAX_ATTEMPTS": 1,  # every webhook delivery's enqueue failed in the database
    "WEBHOOK_DISABLE_AFTER": 1,  # read as 1: an endpoint was disabled at its first failure
    "WORKFLOW_BATCH": 1,  # every ctx.iterate / ctx.batches without every= raised
    "MAX_PARAMETERS_BYTES": 1,  # every enqueue was refused
    "API_MAX_BODY_BYTES": 1,  # every API request with a body was refused (413)
    "WEBHOOK_MAX_RESPONSE_BYTES": 0,  # less than 0 read the whole response, however large
    "STUCK_LIST_LIMIT": 0,  # less than 0 made the stuck page a 500
    "PREFETCH": 0,  # less than 0 claimed nothing for idle workers (0 acts as None)
    "API_MAX_STREAMS_PER_USER": 0,  # less than 0 refused every stream (0 acts as None)
    "METRICS_FOLD_BATCH": 1,  # read as 1: a scrape folded one history row
    "API_MAX_PRIORITY": PRIORITY_RANGE[0],  # no job can have a lower one
}

# The most a numeric key takes (E012).
MAXIMUM: dict[str, float] = {
    "DEFAULT_MAX_ATTEMPTS": MAX_ATTEMPTS_LIMIT,
    "WEBHOOK_MAX_ATTEMPTS": MAX_ATTEMPTS_LIMIT,
    "API_MAX_PRIORITY": PRIORITY_RANGE[1],  # nor a higher one
}

# Fractions (E010): finite, 0 to 1. RETRY_JITTER above 1 (25 for 25 %) multiplied
# delays; below 0 shortened them, NaN made every retry immediate.
FRACTIONS = frozenset({"RETRY_JITTER"})

# Backoff caps (E011): a cap below its base made every delay the cap.
CAPS = {"RETRY_BACKOFF_MAX": "RETRY_BACKOFF_BASE", "WEBHOOK_BACKOFF_MAX": "WEBHOOK_BACKOFF_BASE"}


# The values a text key takes (E006).
CHOICES: dict[str, tuple[str, ...]] = {
    "METRICS_ACCESS": ("token", "staff", "open"),  # any other refused every scrape but a token's
}


# Keys of earlier versions: a warning (the project still starts), not E002.
REMOVED = {
    "PREFETCH_SECONDS": "a busy worker process claims its next job itself and the pusher "
    "claims only for idle ones (WORKER_CHAIN_SECONDS; PREFETCH still sets a fixed prefetch).",
    "CLAIM_BATCH": "the pusher claims one job per idle worker process, or PREFETCH jobs if set, "
    "in one statement; a busy worker process claims its next job itself as it ends one.",
}
