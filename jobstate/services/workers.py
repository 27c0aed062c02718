"""Who is alive: the heartbeats of cluster processes (``WorkerProcess`` rows)."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import IntegrityError, connections, router, transaction
from django.db.models import F, QuerySet
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from jobstate import conf
from jobstate.models.job import LeaseClock
from jobstate.models.worker import WorkerProcess
from jobstate.services._writes import checked_now


def beat(
    name: str,
    *,
    cluster: str,
    role: str,
    job_id: Any = None,
    finished: int = 0,
    renewed: int = 0,
    clock_offset: float | None = None,
    now: datetime | None = None,
) -> datetime | None:
    """Record that process ``name`` is alive (running ``job_id``, or idle when None).

    One UPDATE in the common case; the first beat of a process inserts its row.
    ``finished`` adds to the process's count of jobs done, ``renewed`` to its
    count of lease renewals; ``clock_offset`` (when given) is stored.

    On PostgreSQL ``seen_at`` is the database's clock (unless ``now`` is given),
    the one liveness is judged by, and the UPDATE also returns it
    (``STATEMENT_TIMESTAMP()``) for ``jobstate.worker.clock``; None elsewhere and
    on a first beat. A ``now`` given is timezone-aware with ``USE_TZ = True``, else
    ``ValidationError`` (``_writes.checked_now``), nothing written; so in
    ``alive`` and ``forget_dead``.
    """
    now = checked_now(now)
    db = router.db_for_write(WorkerProcess)
    seen: datetime | LeaseClock = now or timezone.now()
    if now is None and connections[db].vendor == "postgresql":
        seen = LeaseClock()
    now = now or timezone.now()
    values: dict[str, Any] = {"seen_at": seen, "job_id": job_id}
    if finished:
        values["jobs_done"] = F("jobs_done") + finished
    if renewed:
        values["leases_renewed"] = F("leases_renewed") + renewed
    if clock_offset is not None:
        values["clock_offset"] = clock_offset
    rows = WorkerProcess.objects.filter(name=name)
    if connections[db].vendor == "postgresql":
        database_now = _update_returning_clock(rows, values, db)
        if database_now is not None:
            return database_now
    elif rows.update(**values):
        return None
    host, _, pid = name.rpartition(":")
    try:
        with transaction.atomic():
            WorkerProcess.objects.create(
                name=name[:200],
                cluster=cluster[:200],
                host=(host.split(":")[0] or socket.gethostname())[:200],
                pid=int(pid) if pid.isdigit() else os.getpid(),
                role=role,
                started_at=now,
                seen_at=seen,
                job_id=job_id,
                jobs_done=finished,
                leases_renewed=renewed,
            )
    except IntegrityError:  # a concurrent first beat of the same name
        WorkerProcess.objects.filter(name=name).update(**values)
    return None


def _update_returning_clock(
    rows: QuerySet[WorkerProcess], values: dict[str, Any], db: str
) -> datetime | None:
    """``rows.update(**values)`` with ``RETURNING STATEMENT_TIMESTAMP()``: the
    database's clock from the statement the beat runs anyway; None if no row matched."""
    query = cast(UpdateQuery, rows.query.chain(UpdateQuery))
    query.add_update_values(values)
    sql, params = query.get_compiler(db).as_sql()
    with connections[db].cursor() as cursor:
        cursor.execute(f"{sql} RETURNING STATEMENT_TIMESTAMP()", params)
        row = cursor.fetchone()
    return row[0] if row else None


def gone(name: str) -> None:
    """A process that stops cleanly removes its row."""
    WorkerProcess.objects.filter(name=name).delete()


def alive(now: datetime | None = None) -> QuerySet[WorkerProcess]:
    """Processes seen within ``WORKER_ALIVE_SECONDS`` of ``now`` (None: by
    ``LeaseClock``, the database's clock on PostgreSQL); ``now`` as in ``beat``."""
    now = checked_now(now)
    return WorkerProcess.objects.filter(seen_at__gte=_ago(float(conf.get("WORKER_ALIVE_SECONDS")), now))


def recorded() -> QuerySet[WorkerProcess]:
    """Every process row, alive or dead (until ``forget_dead`` prunes it)."""
    return WorkerProcess.objects.order_by()


def forget_dead(older_than_seconds: float = 24 * 3600, now: datetime | None = None) -> int:
    """Delete rows of processes not seen for ``older_than_seconds`` (before ``now``,
    None: by ``LeaseClock``); returns how many. ``now`` as in ``beat``."""
    now = checked_now(now)
    deleted, _ = WorkerProcess.objects.filter(seen_at__lt=_ago(older_than_seconds, now)).delete()
    return deleted


def _ago(seconds: float, now: datetime | None) -> datetime | LeaseClock:
    return LeaseClock(-seconds) if now is None else now - timedelta(seconds=seconds)
