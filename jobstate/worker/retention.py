"""Retention: delete finished jobs older than ``JOBSTATE["RETENTION_DAYS"]``, the
webhook delivery records as old, the records of kind pauses resumed as long ago
(``KindPause``: an active pause is never deleted, however old), and stored asset
files no Asset row names (``services.remove_orphan_files``).

Each batch is one transaction. Deleting a job deletes its history, steps,
assets and, once the transaction commits, the assets' stored files (the
Asset post_delete hook in ``jobstate.apps``). Only jobs without children are
deleted (a parent goes in a later batch, once its children have gone), so that
deleting a job never cascades to a child the retention keeps: one finished
recently (a retry of an old parent's child, say) or still active. A job with an
active job above it (its parent, or further up) is kept until that work ends, and
so are its ancestors: a child workflow that failed, retried, reuses its completed
children. So is every job earlier in the retry chain of an active job
(``retention_holds``): deleted, it would leave the next one's ``retry_of`` empty
(``on_delete=SET_NULL``) while the chain still runs; and so is every job below
those, which a workflow retried with ``retry_from`` reads (its copied steps name its
children), or a retried fan-out reuses (its child workflows' completed children).

Webhook delivery records (one row per attempt, ``jobstate.webhooks``) go by
their own age: they point at jobs by id, not by foreign key, so deleting a job
leaves them. The records of a delivery still under way (its ``jobstate.webhook``
job queued for a retry) are kept until it ends, like the job. So is the job such
a delivery is about: its message shows the job, and would be dropped unsent.

Before the jobs go, a layer that derives totals from their history (``jobstate.metrics``,
once scraped) takes the rows in (``hooks.history_pruning``): a job with a row it has
not reached stays for a later prune, so the counters never miss a pruned job. A dry
run takes nothing in: it asks how far that would go (``hooks.history_reach``).

A prune with a time budget (the scheduled one: ``PRUNE_MAX_SECONDS``) stops between
batches once it has passed and reports ``more``; the next prune goes on. The
delivery records, the orphan-file sweep and the metrics' fold go first, each within a
share of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, QuerySet, TextField, Value
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Lower, Replace
from django.utils import timezone

from jobstate import conf, hooks, services
from jobstate.models import Asset, Job, JobEvent, KindPause
from jobstate.states import ACTIVE, TERMINAL
from jobstate.stuck import no_jit
from jobstate.worker.retention_holds import ActiveAbove, chains_locked, held, held_cte

MAX_DAYS = 36_500  # a century: an older cutoff is before any job
# The webhook deliveries' kind (jobstate.webhooks.outbox.KIND: a sibling package).
WEBHOOK_KIND = "jobstate.webhook"


@dataclass
class PruneReport:
    jobs: int = 0
    events: int = 0
    assets: int = 0
    cutoff: datetime | None = None
    dry_run: bool = False
    orphan_files: list[str] = field(default_factory=list)  # stored files with no Asset row
    deliveries: int = 0  # webhook delivery records
    pauses: int = 0  # records of resumed kind pauses
    more: bool = False  # stopped at its time budget with work left for the next prune

    def as_dict(self) -> dict[str, int]:
        """The counts; ``webhook_deliveries`` and ``kind_pauses`` only when there
        were some, ``more`` only when set (the scheduled task's result keeps its shape
        otherwise)."""
        found = {k: v for k, v in asdict(self).items() if isinstance(v, int) and not isinstance(v, bool)}
        for name, shown in (("deliveries", "webhook_deliveries"), ("pauses", "kind_pauses")):
            count = found.pop(name)
            if count:
                found[shown] = count
        if self.more:  # as the reaper's: the next prune takes the rest
            found["more"] = 1
        return found


def old_enough(days: float, now: datetime | None = None) -> QuerySet[Job]:
    """Finished jobs older than ``days`` with no active job above them (parent, or
    further up), and that no active retry holds (``retention_holds``): each would go
    if nothing below it stays (``prunable``: the next batch; ``would_go``: all of them)."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    return (
        Job.objects.finished()
        .filter(finished_at__lt=cutoff)
        .exclude(ActiveAbove())
        .exclude(held())
        .order_by("finished_at")
    )


def prunable(days: float, now: datetime | None = None, history_upto: int | None = None) -> QuerySet[Job]:
    """What the next batch may delete: ``old_enough`` jobs without children (and, with
    ``history_upto``, no history row past that id: the metrics have counted them)."""
    qs = old_enough(days, now).exclude(Exists(Job.objects.filter(parent_id=OuterRef("pk"))))
    if history_upto is not None:
        qs = qs.exclude(Exists(JobEvent.objects.filter(job_id=OuterRef("pk"), id__gt=history_upto)))
    return qs


_finished_at = Job._meta.get_field("finished_at")


def would_go(days: float, now: datetime | None = None, history_upto: int | None = None) -> QuerySet[Job]:
    """Every job a prune would delete, batch after batch: the ``old_enough`` jobs
    with no job below them that stays (one finished later, or active; with
    ``history_upto``, one with a history row past that id, as in ``prunable``)."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    table = connection.ops.quote_name(Job._meta.db_table)
    terminal = ", ".join(["%s"] * len(TERMINAL))
    refs, refs_params = _announced_refs().query.sql_with_params()
    held, held_params = held_cte()
    # A job an active retry holds stays (``old_enough``), and so keeps its parent (a
    # held job's child keeps a held job); so does a job a delivery is about (as in ``prune``).
    also_kept = f" OR id IN (SELECT id FROM held) OR {_OWN_REF} IN ({refs})"
    if history_upto is not None:  # the metrics have not counted its history yet
        events = connection.ops.quote_name(JobEvent._meta.db_table)
        also_kept += f" OR EXISTS (SELECT 1 FROM {events} e WHERE e.job_id = {table}.id AND e.id > %s)"
    # Each job that stays keeps its parent, whose parent stays, and so on up.
    kept_above = RawSQL(
        f"WITH RECURSIVE {held}, kept(id) AS ("
        f"SELECT parent_id FROM {table} WHERE parent_id IS NOT NULL"
        f" AND (NOT (status IN ({terminal}) AND finished_at < %s){also_kept})"
        f" UNION SELECT j.parent_id FROM {table} j JOIN kept ON j.id = kept.id WHERE j.parent_id IS NOT NULL"
        f") SELECT id FROM kept",
        [
            *held_params,
            *(str(s) for s in TERMINAL),
            _finished_at.get_db_prep_value(cutoff, connection),
            *refs_params,
            *([] if history_upto is None else [history_upto]),
        ],
    )
    gone = _not_announced(old_enough(days, now).exclude(pk__in=kept_above))
    if history_upto is not None:
        gone = gone.exclude(Exists(JobEvent.objects.filter(job_id=OuterRef("pk"), id__gt=history_upto)))
    return gone


def _pending_deliveries() -> QuerySet[Job]:
    return Job.objects.filter(kind=WEBHOOK_KIND, status__in=ACTIVE)


# A job's id as a delivery's parameters name it (``str(uuid)``), lower case without
# dashes: PostgreSQL prints a uuid with them, SQLite stores its 32 hex digits.
_OWN_REF = "REPLACE(CAST(id AS varchar(36)), '-', '')"


def _undashed(text: Any) -> Replace:
    return Replace(text, Value("-"), Value(""), output_field=TextField())


def _announced_refs() -> QuerySet[Any, Any]:
    """The jobs some webhook delivery still under way is about (its parameters name
    the job by id), as ``_OWN_REF``: deleted, the delivery would find nothing to send."""
    ref = _undashed(Lower(KeyTextTransform("job", "parameters")))
    return _pending_deliveries().annotate(ref=ref).filter(ref__isnull=False).order_by().values("ref")


def _not_announced(qs: QuerySet[Job]) -> QuerySet[Job]:
    """``qs`` but the jobs a delivery under way is about, left out in the query itself:
    a prune's batches never read them (a list of them, read batch after batch, grew
    with each batch made only of them, and such batches ran past the time budget)."""
    own = _undashed(Cast("pk", TextField()))
    return qs.alias(own_ref=own).exclude(own_ref__in=_announced_refs())


def _still_childless(pks: list[Any]) -> list[Any]:
    """On PostgreSQL, lock the batch's jobs, then keep those that still have no
    child and that no active retry holds: one committed since the batch was read is
    seen now, and one added from now on waits for the batch (its foreign key check
    shares the parent's or retried job's row), then fails; none is ever deleted with
    its parent, or unlinked from its retried job, unseen. A retry that would hold a
    job from further off (of a job later in its retry chain, or in its parent's) locks
    the job it retries (``services.retry``): those rows are locked too, and a job
    with one held by another transaction is kept this time. (A lock taken by the
    batch's own read made PostgreSQL sort every candidate: 3x slower.)"""
    if not connection.features.has_select_for_update_skip_locked:
        return pks  # SQLite: one writer at a time
    locked = Job.objects.filter(pk__in=pks).select_for_update(skip_locked=True).values_list("pk", flat=True)
    safe = chains_locked(list(locked))
    children = Job.objects.filter(parent_id=OuterRef("pk"))
    childless = Job.objects.filter(pk__in=safe).exclude(Exists(children)).exclude(held())
    return list(childless.values_list("pk", flat=True))


def prunable_deliveries(days: float, now: datetime | None = None) -> QuerySet[models.Model]:
    """Webhook delivery records older than ``days``, but for deliveries still under way.

    Looked up in the app registry: the webhooks package is a sibling of this
    layer (.importlinter), not something it imports."""
    delivery = apps.get_model("jobstate", "WebhookDelivery")
    cutoff = (now or timezone.now()) - timedelta(days=days)
    unfinished = Job.objects.filter(pk=OuterRef("delivery_job_id"), status__in=ACTIVE)
    return delivery.objects.filter(created_at__lt=cutoff).exclude(Exists(unfinished)).order_by("pk")


def prune_deliveries(
    days: float, now: datetime, size: int, deadline: float | None = None
) -> tuple[int, bool]:
    """Delete ``prunable_deliveries`` in batches of ``size``, a transaction each,
    until none is left or (between batches) ``deadline`` has passed. Returns the
    records deleted and whether some were left for the next prune."""
    delivery = apps.get_model("jobstate", "WebhookDelivery")
    deleted = 0
    while True:
        with transaction.atomic():
            pks = list(prunable_deliveries(days, now).values_list("pk", flat=True)[:size])
            if pks:
                deleted += delivery.objects.filter(pk__in=pks).delete()[0]
        if len(pks) < size:
            return deleted, False
        if _past(deadline):
            return deleted, prunable_deliveries(days, now).exists()


def prunable_pauses(days: float, now: datetime | None = None) -> QuerySet[KindPause]:
    """The records of kind pauses resumed more than ``days`` ago. An active pause
    (``resumed_at`` null) is never among them: deleted, its kind would run again."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    return KindPause.objects.filter(resumed_at__lt=cutoff)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


@dataclass(frozen=True)
class Budget:
    """A prune's time budget (``max_seconds``; None: until done), from its start."""

    max_seconds: float | None
    started: float = field(default_factory=time.monotonic)

    @property
    def end(self) -> float | None:
        return None if self.max_seconds is None else self.started + self.max_seconds

    def share(self, fraction: float) -> float | None:
        """A deadline ``fraction`` of the budget from now, at the latest its end."""
        if self.max_seconds is None:
            return None
        return min(self.started + self.max_seconds, time.monotonic() + fraction * self.max_seconds)


# The clean-up steps run before the jobs' deletion, each within this share of the
# budget: a backlog of jobs then takes what is left, and cannot starve them run after run.
STEP_SHARE = 0.2


def prune(
    days: float | None = None,
    *,
    dry_run: bool = False,
    batch: int | None = None,
    now: datetime | None = None,
    max_seconds: float | None = None,
) -> PruneReport:
    """Delete (or with ``dry_run`` count) finished jobs older than ``days``, and never
    younger than METRICS_SETTLE_SECONDS (the metrics have not counted them yet).

    With ``max_seconds``, stop between batches once that time has passed (each
    step does one batch at least) and set ``more`` when something is left: the next
    prune goes on from there."""
    days = conf.get("RETENTION_DAYS") if days is None else days
    if days is None:
        return PruneReport(dry_run=dry_run)
    if not days >= 0:  # NaN fails too
        raise ValueError("days must be zero or more")
    if max_seconds is not None and not (0 < max_seconds < math.inf):  # NaN fails too
        raise ValueError("max_seconds must be a finite number greater than 0")
    # Checked for a dry run too, and 0 refused (not read as "the default"), as the command does.
    size = int(batch if batch is not None else conf.get("PRUNE_BATCH"))
    if size < 1:  # each batch would find nothing and the deliveries' loop ask again, for ever
        raise ValueError("batch must be 1 or more")
    budget = Budget(max_seconds)
    days = min(days, MAX_DAYS)  # a longer retention deletes the same (no) jobs; timedelta would overflow
    days = max(days, _settle_days())
    now = now or timezone.now()
    report = PruneReport(cutoff=now - timedelta(days=days), dry_run=dry_run)
    if dry_run:
        # Where the metrics' fold would stop (asked, not done: nothing is written).
        reach = hooks.history_reach.ask()
        qs = would_go(days, now, None if reach is None else reach.upto)
        with no_jit():  # see _prune_jobs
            report.jobs = qs.count()
            report.events = JobEvent.objects.filter(job__in=qs.values("pk")).count()
            report.assets = Asset.objects.filter(job__in=qs.values("pk")).count()
        report.deliveries = prunable_deliveries(days, now).count()
        report.pauses = prunable_pauses(days, now).count()
        report.orphan_files = services.remove_orphan_files(dry_run=True)
        return report
    report.deliveries, more_deliveries = prune_deliveries(days, now, size, budget.share(STEP_SHARE))
    # One statement: operators pause kinds by hand, a few rows a day at most.
    report.pauses = prunable_pauses(days, now).delete()[0]
    sweep = services.sweep_orphan_files(deadline=budget.share(STEP_SHARE))
    report.orphan_files = sweep.removed
    taken = hooks.history_pruning.ask(budget.share(STEP_SHARE))
    upto = None if taken is None else taken.upto
    more_jobs = _prune_jobs(days, now, size, report, budget.end, upto)
    report.more = more_deliveries or sweep.more or more_jobs or (taken is not None and taken.more)
    return report


def _settle_days() -> float:
    """METRICS_SETTLE_SECONDS, in days: history rows younger than that are not folded
    into the stored metrics yet, and a job deleted with them would never be counted."""
    name = "METRICS_SETTLE_SECONDS"
    settle = conf.get(name) if conf.well_typed(name) else conf.DEFAULTS[name]
    return float(settle) / 86_400


def _prune_jobs(
    days: float, now: datetime, size: int, report: PruneReport, deadline: float | None, upto: int | None
) -> bool:
    """Delete the jobs (none with a history row past ``upto``), batch after batch, adding
    the counts to ``report``; True when stopped at ``deadline`` with prunable jobs left."""
    while True:  # until a batch finds nothing: each makes parents childless for the next
        # Without PostgreSQL's JIT: the recursive tests (an active job above, a retry
        # chain held) are planned as costly, the planner guessing the rows each level
        # reaches, but run in milliseconds; compiling them took seconds a batch.
        with transaction.atomic(), no_jit():
            pks = list(_not_announced(prunable(days, now, upto)).values_list("pk", flat=True)[:size])
            if not pks:
                return False
            pks = _still_childless(pks)
            if not pks:
                # All held by another transaction (another prune, say) or given a
                # child meanwhile: reading again would find the same ones at once.
                return False
            _total, counts = Job.objects.filter(pk__in=pks).delete()
        report.jobs += counts.get("jobstate.Job", 0)
        report.events += counts.get("jobstate.JobEvent", 0)
        report.assets += counts.get("jobstate.Asset", 0)
        if _past(deadline):
            return _not_announced(prunable(days, now, upto)).exists()
