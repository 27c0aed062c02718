"""What a scrape reports: the current-state gauges, taken as one snapshot (a
few grouped queries) and cached per process, and the counters, read at each
scrape (``counters``) from the totals a snapshot's refresh folds in
(``totals.fold``) and the process rows.

A scrape is served from memory while the snapshot is younger than
METRICS_CACHE_SECONDS; past that, the first scrape starts one background
refresh and keeps serving the previous snapshot (stale by at most one refresh),
so a scrape never waits on a count over millions of rows except the very first
one of a process.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import close_old_connections, connection
from django.db.models import Count, Max, Min
from django.utils import timezone

from jobstate import conf, registry
from jobstate.metrics import totals
from jobstate.models import Job
from jobstate.services import pauses, workers
from jobstate.states import Status

logger = logging.getLogger("jobstate.metrics")


@dataclass
class Snapshot:
    taken_at: float  # time.time()
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_ready: dict[str, float] = field(default_factory=dict)
    stuck: dict[str, int] = field(default_factory=dict)
    workers: dict[tuple[str, str], int] = field(default_factory=dict)
    clusters: dict[str, float] = field(default_factory=dict)
    paused: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def stuck_counts(now: datetime | None) -> dict[str, int]:
    """Jobs per stuck reason (``jobstate.stuck.count_stuck``, capped like the admin's)."""
    from jobstate.stuck import count_stuck

    return count_stuck(now)


def job_counts() -> dict[tuple[str, str], int]:
    """Jobs per (kind, status), with a 0 for every status of every registered
    kind or kind with jobs: a status that empties reads 0 rather than vanishing
    from the scrape (series bounded by kinds x statuses)."""
    found: dict[tuple[str, str], int] = {}
    # COUNT(*), not COUNT(pk): the (kind, status) index answers alone (an index-only
    # scan), where counting the ids read the whole table.
    for kind, status, n in Job.objects.order_by().values_list("kind", "status").annotate(n=Count("*")):
        found[(kind, status)] = n
    kinds = set(registry.all_handlers()) | {kind for kind, _ in found}
    return {(kind, status): found.get((kind, status), 0) for kind in kinds for status in Status.values}


def take(now: datetime | None = None) -> Snapshot:
    started = time.monotonic()
    # Liveness (stuck reasons, processes alive) by the database's clock unless given.
    judged, now = now, now or timezone.now()
    snap = Snapshot(taken_at=now.timestamp())
    snap.jobs = job_counts()
    ready = (
        Job.objects.filter(status=Status.QUEUED, run_after__lte=now)
        .order_by()
        .values_list("kind")
        .annotate(oldest=Min("run_after"))
    )
    snap.oldest_ready = {kind: max(0.0, (now - oldest).total_seconds()) for kind, oldest in ready}
    snap.stuck = stuck_counts(judged)
    alive = workers.alive(judged).order_by()
    for cluster, role, n in alive.values_list("cluster", "role").annotate(n=Count("pk")):
        snap.workers[(cluster, role)] = n
    for cluster, seen in alive.values_list("cluster").annotate(seen=Max("seen_at")):
        snap.clusters[cluster] = seen.timestamp()
    snap.paused = {pause.kind: pause.paused_at.timestamp() for pause in pauses.paused_kinds()}
    totals.fold(now)
    snap.seconds = time.monotonic() - started
    return snap


@dataclass
class Counters:
    renewals: dict[tuple[str, str], int]
    totals: totals.Totals


def counters() -> Counters:
    """The counters as stored now (two small tables), read at every scrape: served from
    a process's cached snapshot, they went backwards whenever a scrape reached a process
    whose snapshot was older than another's (Prometheus reads a drop as a reset)."""
    # Every process still recorded (dead ones until pruned): each series only grows.
    renewals = {
        (cluster, name): n
        for cluster, name, n in workers.recorded().values_list("cluster", "name", "leases_renewed")
    }
    return Counters(renewals=renewals, totals=totals.stored())


_lock = threading.Lock()
_current: Snapshot | None = None
_refreshing = False


def reset() -> None:
    global _current
    with _lock:
        _current = None


def current() -> Snapshot:
    """The cached snapshot; taken now if there is none or caching is off."""
    global _current, _refreshing
    ttl = float(conf.get("METRICS_CACHE_SECONDS"))
    snap = _current
    if snap is None or ttl <= 0:
        snap = take()
        with _lock:
            _current = snap
        return snap
    if time.time() - snap.taken_at > ttl:
        with _lock:
            start, _refreshing = not _refreshing, True
        if start:
            threading.Thread(target=_refresh, name="jobstate-metrics-refresh", daemon=True).start()
    return snap


def _refresh() -> None:
    global _current, _refreshing
    try:
        snap = take()
        with _lock:
            _current = snap
    except Exception:  # the next scrape tries again
        logger.exception("Refreshing the jobstate metrics failed")
    finally:
        with _lock:
            _refreshing = False
        if not connection.in_atomic_block:
            connection.close()
        close_old_connections()


def age(snap: Snapshot) -> Any:
    return max(0.0, time.time() - snap.taken_at)
