"""Retention: delete finished jobs older than ``JOBSTATE["RETENTION_DAYS"]``, the
webhook delivery records as old, and stored asset files no Asset row names
(``services.remove_orphan_files``).

Each batch is one transaction. Deleting a job deletes its history, steps,
assets and, once the transaction commits, the assets' stored files (the
Asset post_delete hook in ``jobstate.apps``). Jobs tied to unfinished work (an
active parent, or an active job anywhere below them) are kept until that work ends.

Webhook delivery records (one row per attempt, ``jobstate.webhooks``) go by
their own age: they point at jobs by id, not by foreign key, so deleting a job
leaves them. The records of a delivery still under way (its ``jobstate.webhook``
job queued for a retry) are kept until it ends, like the job.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from jobstate import conf, services
from jobstate.models import Asset, Job, JobEvent
from jobstate.states import ACTIVE


@dataclass
class PruneReport:
    jobs: int = 0
    events: int = 0
    assets: int = 0
    cutoff: datetime | None = None
    dry_run: bool = False
    orphan_files: list[str] = field(default_factory=list)  # stored files with no Asset row
    deliveries: int = 0  # webhook delivery records

    def as_dict(self) -> dict[str, int]:
        """The counts; ``webhook_deliveries`` only when there were some (the
        scheduled task's result keeps its shape otherwise)."""
        found = {k: v for k, v in asdict(self).items() if isinstance(v, int) and not isinstance(v, bool)}
        deliveries = found.pop("deliveries")
        if deliveries:
            found["webhook_deliveries"] = deliveries
        return found


def prunable(days: float, now: datetime | None = None) -> QuerySet[Job]:
    cutoff = (now or timezone.now()) - timedelta(days=days)
    active_child = Job.objects.filter(parent_id=OuterRef("pk"), status__in=ACTIVE)
    active_parent = Job.objects.filter(pk=OuterRef("parent_id"), status__in=ACTIVE)
    qs = (
        Job.objects.finished()
        .filter(finished_at__lt=cutoff)
        .exclude(Exists(active_child))
        .exclude(Exists(active_parent))
        .order_by("finished_at")
    )
    deeper = _distant_ancestors_of_active()
    return qs.exclude(pk__in=deeper) if deeper else qs


def _distant_ancestors_of_active() -> list[Any]:
    """The grandparents of active jobs, their parents and so on: deleting one
    would delete the active job with it (``parent`` cascades), as deleting a
    parent would (``prunable`` excludes those with an ``Exists``). Read now, as a
    list: nested workflows are few, and the planner keeps its plan for the rest of
    the query (a recursive subquery inside it made a batch 3 times slower on
    1,000,000 jobs)."""
    table = connection.ops.quote_name(Job._meta.db_table)
    statuses = ", ".join(["%s"] * len(ACTIVE))
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE up(id) AS ("
            f"SELECT p.parent_id FROM {table} c JOIN {table} p ON p.id = c.parent_id"
            f" WHERE c.status IN ({statuses}) AND p.parent_id IS NOT NULL"
            f" UNION SELECT j.parent_id FROM {table} j JOIN up ON j.id = up.id WHERE j.parent_id IS NOT NULL"
            f") SELECT id FROM up",
            [str(s) for s in ACTIVE],
        )
        return [Job._meta.pk.to_python(row[0]) for row in cursor.fetchall()]


def prunable_deliveries(days: float, now: datetime | None = None) -> QuerySet[models.Model]:
    """Webhook delivery records older than ``days``, but for deliveries still under way.

    Looked up in the app registry: the webhooks package is a sibling of this
    layer (.importlinter), not something it imports."""
    delivery = apps.get_model("jobstate", "WebhookDelivery")
    cutoff = (now or timezone.now()) - timedelta(days=days)
    unfinished = Job.objects.filter(pk=OuterRef("delivery_job_id"), status__in=ACTIVE)
    return delivery.objects.filter(created_at__lt=cutoff).exclude(Exists(unfinished)).order_by("pk")


def prune_deliveries(days: float, now: datetime, size: int) -> int:
    """Delete ``prunable_deliveries`` in batches of ``size``, a transaction each."""
    delivery = apps.get_model("jobstate", "WebhookDelivery")
    deleted = 0
    while True:
        with transaction.atomic():
            pks = list(prunable_deliveries(days, now).values_list("pk", flat=True)[:size])
            if pks:
                deleted += delivery.objects.filter(pk__in=pks).delete()[0]
        if len(pks) < size:
            return deleted


def prune(
    days: float | None = None,
    *,
    dry_run: bool = False,
    batch: int | None = None,
    now: datetime | None = None,
) -> PruneReport:
    """Delete (or with ``dry_run`` count) finished jobs older than ``days``."""
    days = conf.get("RETENTION_DAYS") if days is None else days
    if days is None:
        return PruneReport(dry_run=dry_run)
    if days < 0:
        raise ValueError("days must be zero or more")
    now = now or timezone.now()
    report = PruneReport(cutoff=now - timedelta(days=days), dry_run=dry_run)
    if dry_run:
        qs = prunable(days, now)
        report.jobs = qs.count()
        report.events = JobEvent.objects.filter(job__in=qs.values("pk")).count()
        report.assets = Asset.objects.filter(job__in=qs.values("pk")).count()
        report.deliveries = prunable_deliveries(days, now).count()
        report.orphan_files = services.remove_orphan_files(dry_run=True)
        return report
    size = int(batch or conf.get("PRUNE_BATCH"))
    while True:
        with transaction.atomic():
            pks = list(prunable(days, now).values_list("pk", flat=True)[:size])
            if not pks:
                break
            _total, counts = Job.objects.filter(pk__in=pks).delete()
        report.jobs += counts.get("jobstate.Job", 0)
        report.events += counts.get("jobstate.JobEvent", 0)
        report.assets += counts.get("jobstate.Asset", 0)
        if len(pks) < size:
            break
    report.deliveries = prune_deliveries(days, now, size)
    report.orphan_files = services.remove_orphan_files()
    return report
