"""Stuck jobs found, listed and counted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet

from jobstate import conf
from jobstate.models import Job
from jobstate.states import Status
from jobstate.stuck.codes import RECENTLY_FAILED
from jobstate.stuck.context import Context, fresh_heartbeat_q
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
    ctx = ctx or Context(now)
    wanted = set(codes) if codes is not None else set(BY_CODE)
    limit = int(conf.get("STUCK_LIST_LIMIT")) if limit is None else limit
    base = queryset if queryset is not None else Job.objects.all()
    findings: list[Finding] = []
    for r in REASONS:
        if r.code not in wanted:
            continue
        jobs = base.filter(stuck_q(r.code, ctx)).select_related("owner").order_by(*r.order_by)
        findings.extend(_finding(job, r, ctx) for job in jobs[:limit])
    return findings


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
