"""Numbers for the dashboard, each one query served by an index.

Windows are bounded (the last hour, the last day); durations use PostgreSQL's
``percentile_cont`` or, elsewhere, a bounded sample of recent jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import connections
from django.db.models import Count, Q
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from jobstate import conf
from jobstate.models import Job
from jobstate.states import Status

if TYPE_CHECKING:
    from jobstate.admin.paginator import CappedPaginator

DURATION_SAMPLE = 5000
ACTIVE_ORDER = (Status.QUEUED, Status.WAITING, Status.PROCESSING)
FINISHED = (Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.CANCELLED)


def kind_counts(since: datetime, using: str = "default") -> dict[str, dict[str, int]]:
    """{kind: {status: count}} for active jobs and jobs finished since ``since``,
    biggest kinds first. The all-time history is never read: active jobs are
    counted in the (kind, status) index, one range per stored kind, and finished
    ones in the (status, finished_at) index."""
    from jobstate.stuck import distinct_values

    table: dict[str, dict[str, int]] = {}
    kinds = distinct_values(Job, "kind", 500, using=using)
    active = Job.objects.using(using).filter(kind__in=kinds, status__in=ACTIVE_ORDER)
    finished = Job.objects.using(using).filter(status__in=FINISHED, finished_at__gte=since)
    for qs in (active, finished):
        for kind, status, n in qs.order_by().values_list("kind", "status").annotate(n=Count("*")):
            table.setdefault(kind, {s.value: 0 for s in Status})[status] += n
    return dict(sorted(table.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])))


def active_counts(by_kind: dict[str, dict[str, int]]) -> dict[str, int]:
    """Queued, waiting and processing jobs, summed from ``kind_counts``."""
    return {s: sum(c[s] for c in by_kind.values()) for s in ACTIVE_ORDER}


def counted_jobs(using: str = "default") -> CappedPaginator:
    """Every job counted as the job list counts them: ``count``, and whether it is
    PostgreSQL's estimate (``is_estimate``) or the cap (``is_capped``)."""
    from jobstate.admin.paginator import CappedPaginator

    paginator = CappedPaginator(Job.objects.using(using).all(), 1)
    _ = paginator.count  # sets is_estimate and is_capped
    return paginator


@dataclass
class Throughput:
    """Finished jobs per bucket, by final status; ``earlier``: those of the window's
    first moments, before its first whole bucket (in the totals, not in the bars)."""

    times: list[datetime]
    by_status: dict[str, list[int]]
    earlier: dict[str, int] = field(default_factory=dict)

    def total(self, status: str) -> int:
        """Jobs that ended ``status`` in the whole window (``span`` back from ``now``)."""
        return sum(self.by_status[status]) + self.earlier.get(status, 0)

    @property
    def finished(self) -> int:
        return sum(self.total(s) for s in self.by_status)

    @property
    def failed(self) -> int:
        return self.total(Status.FAILED)

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.finished if self.finished else None


def throughput(now: datetime, *, span: timedelta, bucket: str, using: str = "default") -> Throughput:
    """Jobs finished per ``bucket`` ("minute" or "hour") over the last ``span``.

    Each bucket is a minute or an hour of real time, whatever daylight-saving time does
    to the clock; ``times`` are their starts in local time (01:00 twice at fall back,
    no 02:00 at spring forward). Hours start at local whole hours on ``now``'s clock,
    in India at 10:00 (not at 10:30, UTC's). With ``USE_TZ = False`` the times stored
    are naive, in ``TIME_ZONE``: the buckets are hours of that wall clock."""
    step = timedelta(minutes=1) if bucket == "minute" else timedelta(hours=1)
    trunc = TruncMinute if bucket == "minute" else TruncHour
    frame = None
    if timezone.is_aware(now):
        frame = _frame(now, step)
        now = now.astimezone(UTC)  # ``now - span`` in a local zone is wall-clock time
    end = _floor(now, step, frame)
    start = end - span + step
    starts = [start + step * i for i in range(int(span / step))]
    index = {t: i for i, t in enumerate(starts)}
    by_status: dict[str, list[int]] = {s: [0] * len(starts) for s in FINISHED}
    earlier: dict[str, int] = {}
    rows = (
        Job.objects.using(using)
        # The whole window: the part before the first bucket counts in the totals
        # (it was left out: "last 24 h" missed up to an hour of jobs).
        .filter(status__in=FINISHED, finished_at__gte=now - span)
        .order_by()
        .annotate(b=trunc("finished_at", tzinfo=frame))
        .values_list("b", "status")
        .annotate(n=Count("*"))
    )
    for moment, status, n in rows:
        floored = _floor(moment, step, frame)
        i = index.get(floored)
        if status not in by_status:
            continue
        if i is not None:
            by_status[status][i] += n
        elif floored < start:
            earlier[status] = earlier.get(status, 0) + n
    times = starts if frame is None else [timezone.localtime(t) for t in starts]
    return Throughput(times, by_status, earlier)


def _frame(now: datetime, step: timedelta) -> tzinfo:
    """A zone of fixed offset whose whole ``step``s are the local clock's at ``now``:
    UTC where the offset is whole hours, UTC+00:30 in India. Cut there, every bucket
    is ``step`` of real time (cut in the local zone, wall-clock hours repeat or skip)."""
    shift = (timezone.localtime(now).utcoffset() or timedelta(0)) % step
    return dt_timezone(shift) if shift else UTC


def _floor(moment: datetime, step: timedelta, frame: tzinfo | None) -> datetime:
    if frame is not None:
        moment = moment.astimezone(frame)
    if step >= timedelta(hours=1):
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


@dataclass
class Durations:
    kind: str
    count: int
    p50: float | None
    p95: float | None


def durations(
    now: datetime, *, span: timedelta = timedelta(days=1), using: str = "default"
) -> list[Durations]:
    """Run time (start of the last attempt to finish) of jobs that succeeded in the window:
    every one on PostgreSQL; elsewhere the percentiles are those of the ``DURATION_SAMPLE``
    most recent (the counts are of every one)."""
    since = now - span
    connection = connections[using]
    if connection.vendor == "postgresql":
        sql = (
            "SELECT kind, COUNT(*),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM finished_at - started_at)),"
            " percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM finished_at - started_at))"
            f" FROM {connection.ops.quote_name(Job._meta.db_table)}"
            " WHERE status IN (%s, %s) AND finished_at >= %s AND started_at IS NOT NULL"
            " GROUP BY kind ORDER BY kind"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [Status.COMPLETED, Status.PARTIAL, since])
            return [Durations(k, n, _f(a), _f(b)) for k, n, a, b in cursor.fetchall()]
    done = Job.objects.using(using).filter(
        status__in=[Status.COMPLETED, Status.PARTIAL], finished_at__gte=since, started_at__isnull=False
    )
    rows = done.order_by("-finished_at").values_list("kind", "started_at", "finished_at")[:DURATION_SAMPLE]
    samples: dict[str, list[float]] = {}
    for kind, started, finished in rows:
        if started is None or finished is None:  # (the filter leaves none)
            continue
        samples.setdefault(kind, []).append((finished - started).total_seconds())
    # The percentiles are the sample's; the count is every job of the window (a kind
    # with none among the sample has no percentile).
    counts = dict(done.order_by().values_list("kind").annotate(n=Count("*")).values_list("kind", "n"))
    return [
        Durations(kind, n, percentile(samples.get(kind, []), 0.5), percentile(samples.get(kind, []), 0.95))
        for kind, n in sorted(counts.items())
    ]


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks, as ``percentile_cont`` does."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# Dead processes stay on the panel this long (then only the worker-processes list has them).
DEAD_SHOWN = timedelta(hours=1)
PROCESS_ROWS = 200


@dataclass
class Process:
    """One cluster process as its heartbeat row tells it."""

    name: str
    role: str
    pid: int
    started_at: datetime
    seen_at: datetime
    job_id: Any
    jobs_done: int
    alive: bool
    job_kind: str = ""
    job_progress: int | None = None

    @property
    def state(self) -> str:
        if not self.alive:
            return "dead"
        if self.role != "worker":
            return "alive"
        return "busy" if self.job_id else "idle"


@dataclass
class Cluster:
    name: str
    host: str
    processes: list[Process] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return any(p.alive for p in self.processes)

    @property
    def workers_alive(self) -> int:
        return sum(1 for p in self.processes if p.alive and p.role == "worker")

    @property
    def busy(self) -> int:
        return sum(1 for p in self.processes if p.state == "busy")


@dataclass
class Workers:
    """The clusters seen lately, their processes alive or dead (``WorkerProcess`` rows)."""

    clusters: list[Cluster] = field(default_factory=list)
    alive_seconds: int = 0
    truncated: bool = False
    # (worker processes alive, busy, clusters alive) counted in the table when
    # ``clusters`` does not list every process; None: they are counted from it.
    counted: tuple[int, int, int] | None = None

    @property
    def alive(self) -> int:
        """Worker processes alive (busy or idle)."""
        if self.counted is not None:
            return self.counted[0]
        return sum(c.workers_alive for c in self.clusters)

    @property
    def busy(self) -> int:
        if self.counted is not None:
            return self.counted[1]
        return sum(c.busy for c in self.clusters)

    @property
    def clusters_alive(self) -> int:
        if self.counted is not None:
            return self.counted[2]
        return sum(1 for c in self.clusters if c.alive)

    @property
    def dead(self) -> int:
        return sum(1 for c in self.clusters for p in c.processes if not p.alive)


def workers(now: datetime, using: str = "default") -> Workers:
    """Every cluster process seen in the last hour: alive when seen within
    ``WORKER_ALIVE_SECONDS`` (idle or busy), else dead. At most ``PROCESS_ROWS``
    are listed, live ones first; past that the figures are counted in the table."""
    from jobstate.models import WorkerProcess

    alive_seconds = float(conf.get("WORKER_ALIVE_SECONDS"))
    fresh = now - timedelta(seconds=alive_seconds)
    recent = WorkerProcess.objects.using(using).order_by("cluster", "role", "name")
    # Live rows first: dead ones only fill the room they leave.
    rows = list(recent.filter(seen_at__gte=fresh)[: PROCESS_ROWS + 1])
    if len(rows) <= PROCESS_ROWS:
        shown_since = now - max(DEAD_SHOWN, timedelta(seconds=alive_seconds))
        rows += recent.filter(seen_at__gte=shown_since, seen_at__lt=fresh)[: PROCESS_ROWS + 1 - len(rows)]
    result = Workers(alive_seconds=int(alive_seconds), truncated=len(rows) > PROCESS_ROWS)
    if result.truncated:
        result.counted = _count_alive(using, fresh)
    running = {r.job_id for r in rows[:PROCESS_ROWS] if r.job_id and r.seen_at >= fresh}
    jobs: dict[UUID | None, tuple[str, int | None]] = {
        pk: (kind, progress)
        for pk, kind, progress in Job.objects.using(using)
        .filter(pk__in=running)
        .values_list("pk", "kind", "progress")
    }
    by_name: dict[str, Cluster] = {}
    for row in rows[:PROCESS_ROWS]:
        cluster = by_name.get(row.cluster)
        if cluster is None:
            cluster = by_name[row.cluster] = Cluster(row.cluster, row.host)
            result.clusters.append(cluster)
        alive = row.seen_at >= fresh
        kind, progress = jobs.get(row.job_id, ("", None))
        cluster.processes.append(
            Process(
                name=row.name,
                role=row.role,
                pid=row.pid,
                started_at=row.started_at,
                seen_at=row.seen_at,
                job_id=row.job_id if alive else None,
                jobs_done=row.jobs_done,
                alive=alive,
                job_kind=kind,
                job_progress=progress,
            )
        )
    # Live clusters first; inside one, the pusher first, then workers by name.
    result.clusters.sort(key=lambda c: (not c.alive, c.name))
    for c in result.clusters:
        c.processes.sort(key=lambda p: (p.role != "pusher", not p.alive, p.pid, p.name))
    return result


def _count_alive(using: str, fresh: datetime) -> tuple[int, int, int]:
    """(worker processes alive, busy, clusters alive): one query over the live rows."""
    from jobstate.models import WorkerProcess

    worker = Q(role=WorkerProcess.Role.WORKER)
    counts = (
        WorkerProcess.objects.using(using)
        .filter(seen_at__gte=fresh)
        .aggregate(
            alive=Count("pk", filter=worker),
            busy=Count("pk", filter=worker & Q(job_id__isnull=False)),
            clusters=Count("cluster", distinct=True),
        )
    )
    return counts["alive"], counts["busy"], counts["clusters"]
