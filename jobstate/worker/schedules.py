"""The django-q2 Schedules jobstate needs: the reaper (every minute) and retention
(daily). ``manage.py jobstate_schedule`` installs or updates them; running it
again changes nothing that is already right.

A schedule's ``cluster`` says which django-q2 cluster runs it: None, any cluster whose
``cluster_name`` is its ``name``; else only the cluster of that ``cluster_name`` (or, with
none, that ``name``). ``install`` sets it when given one, and otherwise keeps the value an
operator chose: a project with several clusters pins them to the jobs cluster."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone
from django_q.models import Schedule

from jobstate import conf

REAPER = "jobstate: reap lost workers"
PRUNE = "jobstate: prune finished jobs"
CLUSTER_MAX_LENGTH = Schedule._meta.get_field("cluster").max_length or 100


@dataclass(frozen=True)
class Wanted:
    name: str
    func: str
    schedule_type: str
    minutes: int | None = None


def wanted(prune: bool = True) -> list[Wanted]:
    items = [Wanted(REAPER, "jobstate.worker.tasks.reap", Schedule.MINUTES, 1)]
    if prune and conf.get("RETENTION_DAYS") is not None:
        items.append(Wanted(PRUNE, "jobstate.worker.tasks.prune", Schedule.DAILY))
    return items


def install(prune: bool = True, cluster: str | None = None) -> dict[str, str]:
    """Create or update the schedules; remove the pruning one when not wanted. With
    ``cluster``, they run in that cluster; without, a new one has none and an existing
    one keeps its own (``pinned``). Returns ``{name: "created" | "updated" |
    "unchanged" | "removed"}``."""
    if cluster is not None and not 0 < len(cluster) <= CLUSTER_MAX_LENGTH:
        raise ValueError(f"cluster must be 1 to {CLUSTER_MAX_LENGTH} characters")
    outcome: dict[str, str] = {}
    keep = wanted(prune)
    with transaction.atomic():
        _serialize()
        for item in keep:
            existing = Schedule.objects.filter(name=item.name).order_by("pk")
            current = existing.first()
            if current is None:
                Schedule.objects.create(
                    name=item.name,
                    func=item.func,
                    schedule_type=item.schedule_type,
                    minutes=item.minutes,
                    repeats=-1,
                    next_run=timezone.now(),
                    cluster=cluster,
                )
                outcome[item.name] = "created"
                continue
            existing.exclude(pk=current.pk).delete()
            fields = {
                "func": item.func,
                "schedule_type": item.schedule_type,
                "minutes": item.minutes,
                "repeats": -1,
                "cron": None,
                "args": None,
                "kwargs": None,
                "cluster": current.cluster if cluster is None else cluster,
            }
            changed: dict[str, object] = {k: v for k, v in fields.items() if getattr(current, k) != v}
            now = timezone.now()
            if current.next_run is None or (
                changed.keys() & {"schedule_type", "minutes", "repeats"} and current.next_run > now
            ):
                # The stale row's next run (a day away for an old daily schedule) would
                # hold off the new cadence until then; a row without one never runs.
                changed["next_run"] = now
            if changed:
                for key, value in changed.items():
                    setattr(current, key, value)
                current.save()
            outcome[item.name] = "updated" if changed else "unchanged"
        names = {item.name for item in keep}
        for name in (REAPER, PRUNE):
            if name not in names and Schedule.objects.filter(name=name).delete()[0]:
                outcome[name] = "removed"
    return outcome


def missing() -> list[Wanted]:
    """The schedules that do not run because ``jobstate_schedule`` never ran (or was
    given ``--remove``): it always installs the reaper's, so that one's row says it
    ran; a prune left out by ``--no-prune`` is the operator's choice."""
    if Schedule.objects.filter(name=REAPER).exists():
        return []
    return wanted()


def pinned() -> dict[str, str]:
    """jobstate's schedules that name a cluster: ``{name: cluster}``."""
    found = Schedule.objects.filter(name__in=[REAPER, PRUNE], cluster__isnull=False)
    return dict(found.order_by("pk").values_list("name", "cluster"))


def _serialize() -> None:
    """PostgreSQL: two installs at once (a deploy's replicas each running the command)
    take turns, so that the second sees the first's schedules instead of adding its
    own copies (no unique name in django-q2's table). SQLite's IMMEDIATE transaction
    holds the write lock already. (Not "jobstate:...": claims lock "jobstate:<kind>".)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('jobstate-schedules'))")


def uninstall() -> int:
    deleted: int = Schedule.objects.filter(name__in=[REAPER, PRUNE]).delete()[0]
    return deleted
