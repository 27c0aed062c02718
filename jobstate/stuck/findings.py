"""Stuck jobs found, listed and counted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Case, CharField, Count, DateTimeField, F, QuerySet, Value, When

from jobstate import conf
from jobstate.models import Job
from jobstate.states import Status
from jobstate.stuck.codes import QUEUED_NO_WORKER, RECENTLY_FAILED
from jobstate.stuck.context import Context, fresh_heartbeat_q, no_jit
from jobstate.stuck.reasons import BY_CODE, REASONS, Reason, stuck_q


@dataclass(frozen=True)
class Finding:
    job: Job
    reason: str
    title: str
    text: str
    remedy: str
    remedy_text: str
    since: datetime | None
    short: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": str(self.job.pk),
            "kind": self.job.kind,
            "status": self.job.status,
            "reason": self.reason,
            "title": self.title,
            "text": self.text,
            "remedy": self.remedy,
            "remedy_text": self.remedy_text,
            "since": self.since.isoformat() if self.since else None,
        }


def _finding(job: Job, r: Reason, ctx: Context) -> Finding:
    return Finding(
        job=job,
        reason=r.code,
        title=r.title,
        text=r.describe(job, ctx),
        remedy=r.remedy,
        remedy_text=r.remedy_text,
        since=getattr(job, r.since_field),
        short=r.short,
    )


def check(job: Job, now: datetime | None = None, *, ctx: Context | None = None) -> Finding | None:
    """Classify one loaded job: its finding, or None when it is fine."""
    ctx = ctx or Context(now)
    for r in REASONS:
        if r.check(job, ctx):
            return _finding(job, r, ctx)
    return None


def find_stuck(
    now: datetime | None = None,
    *,
    codes: Iterable[str] | None = None,
    limit: int | None = None,
    queryset: QuerySet[Job] | None = None,
    ctx: Context | None = None,
) -> list[Finding]:
    """Findings grouped by reason (in ``REASONS`` order), at most ``limit`` per reason."""
    return _survey(ctx or Context(now), codes, limit, queryset, cap=None)[0]


def survey(
    now: datetime | None = None,
    *,
    codes: Iterable[str] | None = None,
    limit: int | None = None,
    cap: int | None = None,
    ctx: Context | None = None,
) -> tuple[list[Finding], dict[str, int]]:
    """``find_stuck`` and ``count_stuck`` together, for a page that shows both: the
    processing jobs are read once for the two."""
    cap = int(conf.get("ADMIN_COUNT_CAP")) if cap is None else cap
    findings, counts = _survey(ctx or Context(now), codes, limit, None, cap)
    assert counts is not None
    return findings, counts


def _survey(
    ctx: Context,
    codes: Iterable[str] | None,
    limit: int | None,
    queryset: QuerySet[Job] | None,
    cap: int | None,
) -> tuple[list[Finding], dict[str, int] | None]:
    """Findings, and with a ``cap`` the count of each reason up to it."""
    wanted = set(codes) if codes is not None else set(BY_CODE)
    limit = int(conf.get("STUCK_LIST_LIMIT")) if limit is None else limit
    base = queryset if queryset is not None else Job.objects.all()
    held = [r for r in REASONS if r.code in wanted and r.status == Status.PROCESSING]
    findings: list[Finding] = []
    counts: dict[str, int] = {}
    found: dict[str, list[Job]] = {}
    totals: dict[str, int] = {}
    # One reason alone, only listed, is a plain query (an index may serve it).
    if len(held) > 1 or (held and cap is not None):
        found, totals = _find_held(held, base, ctx, limit, learn_running=QUEUED_NO_WORKER in wanted)
    for r in REASONS:
        if r.code not in wanted:
            continue
        if r.code in found:
            jobs = found[r.code]
            counts[r.code] = totals[r.code]
        else:
            matching = base.filter(stuck_q(r.code, ctx))
            jobs = list(matching.select_related("owner").order_by(*r.order_by)[:limit])
            if cap is not None:
                counts[r.code] = len(jobs) if len(jobs) < limit else matching.order_by()[:cap].count()
        findings.extend(_finding(job, r, ctx) for job in jobs)
    return findings, (None if cap is None else {code: min(cap, n) for code, n in counts.items()})


# Each reason's jobs counted, and ranked oldest first up to the limit, from the
# narrow rows ``p`` (whole rows of every processing job spilled the sort to disk;
# the few ranked jobs are loaded after). On PostgreSQL each reason keeps its
# first ones in a bounded top-N sort: ranking every row sorted them all, and at
# 50,000 processing jobs spilled even the narrow rows (275 -> 200 ms). SQLite
# has no LATERAL: it ranks them all.
_RANKED = {
    True: (
        "c (reason, total) AS (SELECT reason, COUNT(*) FROM p WHERE reason IS NOT NULL GROUP BY reason)"
        " SELECT t.id, c.reason, t.n, c.total FROM c CROSS JOIN LATERAL ("
        "  SELECT id, ROW_NUMBER() OVER (ORDER BY since, id) AS n FROM ("
        "   SELECT id, since FROM p WHERE p.reason = c.reason ORDER BY since, id LIMIT %s"
        "  ) head) t"
    ),
    False: (
        "ranked AS (SELECT id, reason, ROW_NUMBER() OVER (PARTITION BY reason ORDER BY since, id) AS n,"
        "  COUNT(*) OVER (PARTITION BY reason) AS total FROM p WHERE reason IS NOT NULL)"
        " SELECT id, reason, n, total FROM ranked WHERE n <= %s"
    ),
}


def _find_held(
    held: list[Reason], base: QuerySet[Job], ctx: Context, limit: int, learn_running: bool
) -> tuple[dict[str, list[Job]], dict[str, int]]:
    """The first ``limit`` jobs of each reason of processing jobs and how many each
    holds, in one pass over them (see ``_count_held``): each job under its first
    reason, ranked within it by the reason's own order (oldest first). The same
    pass tells ``ctx`` the kinds running with a fresh heartbeat (not from a
    queryset scoped to an owner: a worker serves everyone's)."""
    # (Only when asked for the queued jobs no worker serves, and a kind's service is in doubt.)
    learn_running = learn_running and ctx.running is None and not base.query.where and bool(ctx.idle_kinds)
    reason = Case(*[When(stuck_q(r.code, ctx), then=Value(r.code)) for r in held], output_field=CharField())
    since = Case(
        *[When(stuck_q(r.code, ctx), then=F(r.order_by[0])) for r in held], output_field=DateTimeField()
    )
    fresh = Case(When(fresh_heartbeat_q(ctx.now), then=Value(1)), default=Value(0))
    processing = (
        base.filter(status=Status.PROCESSING)
        .annotate(stuck_reason=reason, stuck_since=since, stuck_fresh=fresh)
        .order_by()
        .values_list("pk", "kind", "stuck_reason", "stuck_since", "stuck_fresh")
    )
    inner, params = processing.query.get_compiler(base.db).as_sql()
    pk = base.model._meta.pk
    assert pk is not None
    connection = connections[base.db]
    ranked = _RANKED[connection.vendor == "postgresql"]
    sql = f"WITH p (id, kind, reason, since, fresh) AS ({inner}), {ranked}"
    if learn_running:
        sql += " UNION ALL SELECT NULL, kind, NULL, NULL FROM p WHERE fresh = 1 GROUP BY kind"
    # The planner overestimates the OR-ed reasons; JIT-compiling took longer than the query.
    with no_jit(base.db), connection.cursor() as cursor:
        cursor.execute(sql, [*params, max(limit, 1)])  # one row per reason at least: its total
        rows = cursor.fetchall()
    top = sorted((r for r in rows if r[2] is not None), key=lambda row: row[2])
    if learn_running:
        ctx.running = frozenset(row[1] for row in rows if row[2] is None)
    shown = [pk.to_python(row[0]) for row in top if row[2] <= limit]
    jobs = base.select_related("owner").order_by().in_bulk(shown) if shown else {}
    found: dict[str, list[Job]] = {r.code: [] for r in held}
    totals: dict[str, int] = {r.code: 0 for r in held}
    for job_id, code, rank, total in top:
        totals[code] = total
        job = jobs.get(pk.to_python(job_id)) if rank <= limit else None
        # Loaded a moment after they were ranked: one that ended (or was deleted) meanwhile is left out.
        if job is not None and BY_CODE[code].check(job, ctx):
            found[code].append(job)
    return found, totals


def count_stuck(
    now: datetime | None = None,
    *,
    codes: Iterable[str] | None = None,
    cap: int | None = None,
    ctx: Context | None = None,
) -> dict[str, int]:
    """How many jobs each reason holds, counting at most ``cap`` rows per reason."""
    ctx = ctx or Context(now)
    wanted = set(codes) if codes is not None else set(BY_CODE)
    cap = int(conf.get("ADMIN_COUNT_CAP")) if cap is None else cap
    held = [r for r in REASONS if r.code in wanted and r.status == Status.PROCESSING]
    counts = _count_held(held, ctx) if held else {}
    return {
        r.code: min(cap, counts[r.code])
        if r.code in counts
        else Job.objects.filter(stuck_q(r.code, ctx)).order_by()[:cap].count()
        for r in REASONS
        if r.code in wanted
    }


def _count_held(held: list[Reason], ctx: Context) -> dict[str, int]:
    """The reasons of processing jobs counted in one pass over them, by kind, which
    also tells ``ctx`` the kinds running with a fresh heartbeat: no index covers a
    lease, heartbeat or start time (columns written while a job runs are kept out
    of every index, so that those writes are HOT), so each reason counted on its
    own would read every processing job again."""
    per_kind = (
        Job.objects.filter(status=Status.PROCESSING)
        .order_by()
        .values("kind")
        .annotate(
            fresh=Count("pk", filter=fresh_heartbeat_q(ctx.now)),
            **{f"n{i}": Count("pk", filter=stuck_q(r.code, ctx)) for i, r in enumerate(held)},
        )
    )
    rows: list[dict[str, Any]] = [dict(row) for row in per_kind]
    if ctx.running is None:
        ctx.running = frozenset(row["kind"] for row in rows if row["fresh"])
    return {r.code: sum(row[f"n{i}"] for row in rows) for i, r in enumerate(held)}


ACTIVE_REASONS: frozenset[str] = frozenset(r.code for r in REASONS if r.code != RECENTLY_FAILED)
