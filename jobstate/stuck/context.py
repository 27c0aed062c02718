"""What every stuck reason shares: the time, thresholds, handler timeouts and the
kinds a worker is serving right now."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Model, Q
from django.utils.timesince import timesince

from jobstate import conf, registry
from jobstate.models import Job, KindPause
from jobstate.models.job import LeaseClock
from jobstate.states import TERMINAL, Status


def _seconds(name: str) -> timedelta:
    return timedelta(seconds=float(conf.get(name)))


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    if moment > now:
        return "in the future"
    seconds = int((now - moment).total_seconds())
    if seconds < 60:  # timesince said "0 minutes ago" beside the page's "51s"
        return "just now" if seconds < 1 else f"{seconds} second{'' if seconds == 1 else 's'} ago"
    return f"{timesince(moment, now)} ago"


# Stored kinds looked at for queued_no_worker: one index probe each, so all of any
# real project's (the first 200 only, before: a later kind was never reported).
KINDS_MAX = 10_000


class Context:
    """Per-call values shared by the reasons: the time, and (lazily) which kinds a
    worker is serving right now.

    The time, unless given, is the database's clock on PostgreSQL (one query):
    the one leases and heartbeats are written by, whatever this machine's says."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or LeaseClock.read()
        self._stored: list[str] | None = None
        self._finished: frozenset[str] | None = None
        self._idle: frozenset[str] | None = None
        self._served: frozenset[str] | None = None
        self._unserved: list[str] | None = None
        self._paused: dict[str, KindPause] | None = None
        # Kinds running with a fresh heartbeat, when a pass over the processing
        # jobs already found them (``findings.count_stuck``).
        self.running: frozenset[str] | None = None

    @property
    def finished_kinds(self) -> frozenset[str]:
        if self._finished is None:
            self._finished = finished_kinds(self.now)
        return self._finished

    @property
    def served_kinds(self) -> frozenset[str]:
        """Every kind a worker is visibly serving."""
        if self._served is None:
            running = self.running if self.running is not None else running_kinds(self.now)
            self._served = self.finished_kinds | running
        return self._served

    @property
    def stored_kinds(self) -> list[str]:
        """The kinds in the Job table, in order (the first ``KINDS_MAX``)."""
        if self._stored is None:
            self._stored = distinct_values(Job, "kind", limit=KINDS_MAX)
        return self._stored

    @property
    def idle_kinds(self) -> frozenset[str]:
        """Stored kinds that finished no job lately: a worker serves them only if one
        of their jobs is running (usually there is none)."""
        if self._idle is None:
            self._idle = frozenset(self.stored_kinds) - self.finished_kinds
        return self._idle

    @property
    def paused(self) -> dict[str, KindPause]:
        """The active pauses by kind (usually none): their queued jobs are
        ``queued_kind_paused``, never ``queued_no_worker``."""
        if self._paused is None:
            active = KindPause.objects.active().select_related("paused_by")
            self._paused = {pause.kind: pause for pause in active}
        return self._paused

    @property
    def unserved_kinds(self) -> list[str]:
        """Stored kinds that no worker is visibly serving (usually none): what both the
        filter and the check of ``queued_no_worker`` go by."""
        if self._unserved is None:
            # Kinds that finished a job lately come from an index; the running ones
            # are looked for among the rest only.
            rest = self.idle_kinds
            if rest and self._served is not None:
                rest -= self._served
            elif rest:
                rest -= self.running if self.running is not None else running_kinds(self.now, rest)
            self._unserved = sorted(rest - set(self.paused))
        return self._unserved


def distinct_values(model: type[Model], column: str, limit: int = 200, using: str = "default") -> list[Any]:
    """Distinct non-null values of an indexed column, hopping through its index
    (one index probe per value instead of a scan of every row)."""
    connection = connections[using]
    qn = connection.ops.quote_name
    table, col = qn(model._meta.db_table), qn(column)
    sql = (
        f"WITH RECURSIVE v(x) AS ("
        f" SELECT MIN({col}) FROM {table} WHERE {col} IS NOT NULL"  # a partial index's condition
        f" UNION ALL"
        f" SELECT (SELECT MIN({col}) FROM {table} WHERE {col} > v.x) FROM v WHERE v.x IS NOT NULL"
        f") SELECT x FROM v WHERE x IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


@contextmanager
def no_jit(using: str = "default") -> Iterator[None]:
    """Queries inside run without PostgreSQL's JIT compiler (off for a transaction,
    or until the end of the block within an outer one; elsewhere nothing changes).
    The stuck queries' OR-ed reasons make the planner overestimate their cost: at
    1,000,000 jobs a capped count that runs in 13 ms spent 240 ms compiling first."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield
        return
    outer = not connection.get_autocommit()  # an atomic block or a manual transaction
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('jit'), set_config('jit', 'off', true)")
            row = cursor.fetchone()
        yield
        # (After an error the savepoint's rollback restores the setting.)
        if outer and row is not None and not connection.needs_rollback:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('jit', %s, true)", [row[0]])


def timeouts() -> tuple[dict[str, float], float]:
    """(per-kind handler timeouts, the default for every other kind), seconds."""
    custom = {name: float(spec.timeout) for name, spec in registry.all_handlers().items() if spec.timeout}
    return custom, float(conf.get("DEFAULT_TIMEOUT"))


def timeout_for(kind: str) -> float:
    custom, default = timeouts()
    return custom.get(kind, default)


def fresh_heartbeat_q(now: datetime) -> Q:
    """Processing jobs whose worker beat within ``STUCK_NO_HEARTBEAT_SECONDS``."""
    return Q(status=Status.PROCESSING, heartbeat_at__gte=now - _seconds("STUCK_NO_HEARTBEAT_SECONDS"))


def finished_kinds(now: datetime) -> frozenset[str]:
    """Kinds of which a worker finished a job within the queued-past-due window (a
    job cancelled or failed before it ever started says nothing of a worker)."""
    window = now - _seconds("STUCK_QUEUED_PAST_DUE_SECONDS")
    finished = Job.objects.filter(status__in=TERMINAL, finished_at__gte=window, started_at__isnull=False)
    return frozenset(finished.order_by().values_list("kind", flat=True).distinct())


def running_kinds(now: datetime, among: Iterable[str] | None = None) -> frozenset[str]:
    """Kinds (of ``among``, when given) of which a job runs with a fresh heartbeat."""
    running = Job.objects.filter(fresh_heartbeat_q(now))
    if among is not None:
        running = running.filter(kind__in=list(among))
    return frozenset(running.order_by().values_list("kind", flat=True).distinct())


def served_kinds(now: datetime | None = None, running: frozenset[str] | None = None) -> frozenset[str]:
    """Kinds a worker is visibly serving: a job of that kind is running with a fresh
    heartbeat (``running``, when already known), or one finished within the
    queued-past-due window."""
    now = now or LeaseClock.read()
    return finished_kinds(now) | (running if running is not None else running_kinds(now))
