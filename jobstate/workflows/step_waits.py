"""A fan-out step's waits on its child jobs: it starts them and waits
(``wait``), waits again for the same children in a later run (``resume_wait``),
and names them (``children_of``). Each write holds the job's lease
(``step_lease``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import StepStateError
from jobstate.models import Job, JobStep
from jobstate.models.step import StepStatus
from jobstate.services.steps import move_step
from jobstate.states import ACTIVE, Status
from jobstate.storable import result_value
from jobstate.workflows import spawns
from jobstate.workflows.spawns import CHUNK, REUSED, SPAWNED, ChildSpec, Reuse
from jobstate.workflows.step_lease import actor_of, hold

S = StepStatus


def wait(
    job: Job,
    token: Any,
    name: str,
    children: list[ChildSpec],
    *,
    value: Any,
    band: tuple[float, float],
    reuse: Reuse | None = None,
) -> list[Job]:
    """Start the step's child jobs and mark it ``waiting``, all in one transaction:
    either every child exists and the step waits for them, or nothing happened.
    ``reuse``: the earlier run's completed children some of them take instead, and
    those that did not complete which the new ones retry (``retry_of``)
    (``jobstate.workflows.reuse``); the step's ``detail`` and history name them."""
    value = result_value(value, "output")
    picks = reuse.picks if reuse is not None and reuse.picks else (None,) * len(children)
    retries = reuse.retries if reuse is not None and reuse.retries else (None,) * len(children)
    now = timezone.now()
    with transaction.atomic():
        hold(job, token, percent=band[0], message=f"waiting for {len(children)} child jobs", step=name)
        row = JobStep.objects.select_for_update().get(job_id=job.pk, name=name)
        if row.status != S.RUNNING:  # checked before its children are created
            raise StepStateError(job.pk, name, "wait in it", row.status)
        earlier = _retried(reuse)
        new: list[services.Child] = []
        for child, pick, old in zip(children, picks, retries, strict=True):
            if pick is None:
                retry_of = earlier.get(old) if old is not None else None
                reason = f"child of step '{name}'" + (f", retry of {old}" if retry_of else "")
                base = child.checked or services.Child(child.kind, child.parameters, **child.options)
                new.append(base.retrying(retry_of, reason))
        created = services.enqueue_children(job, new, actor=actor_of(job))
        made = iter(created)
        ids = [pick or str(next(made).pk) for pick in picks]
        reuse = reuse or Reuse()
        if SPAWNED in row.detail:
            spawns.drop(job.pk, name)
        detail = {k: v for k, v in row.detail.items() if k not in (REUSED, SPAWNED)}
        detail.update(children=ids, total=len(ids), value=value, band=list(band), **reuse.note())
        metadata: dict[str, Any] = {"children": len(ids)}
        reason = ""
        if reuse.jobs:
            metadata.update(reused=len(reuse.jobs), reused_from=reuse.source)
            reason = f"reused {len(reuse.jobs)} completed child jobs of {reuse.source}"
        if earlier:
            metadata.update(retries=len(earlier), retries_from=reuse.source)
        move_step(
            job.pk,
            name,
            "wait",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields={"detail": detail},
            reason=reason,
            metadata=metadata,
            requested="wait in it",
            now=now,
        )
    return created


def _retried(reuse: Reuse | None) -> dict[str, Job]:
    """The earlier children the new ones retry, by id, each locked as ``services.retry``
    locks the job it retries. One deleted meanwhile, or retried by someone else since
    the plan (a job is retried once), is left out: its spawn starts a child that
    retries none."""
    ids = sorted(reuse.retried) if reuse is not None else []
    found: dict[str, Job] = {}
    for i in range(0, len(ids), CHUNK):
        chunk = [uuid.UUID(pk) for pk in ids[i : i + CHUNK]]
        locked = Job.objects.select_for_update(no_key=True).filter(pk__in=chunk).order_by("pk")
        found.update((str(old.pk), old) for old in locked)
        taken = Job.objects.filter(retry_of_id__in=chunk).values_list("retry_of_id", flat=True)
        for pk in taken:
            found.pop(str(pk), None)
    return found


def resume_wait(job: Job, token: Any, row: JobStep, *, band: tuple[float, float]) -> None:
    """A fan-out step whose children an earlier run of this job started (that run then
    failed, say, while fanning in): ``waiting`` again for the same children, so a
    retry never starts them twice. The job shows the share of them that finished
    within ``band``, as it did while it waited (``placed``)."""
    now = timezone.now()
    with transaction.atomic():
        total = row.detail.get("total") or len(row.detail.get("children", []))
        active = Job.objects.filter(parent_id=job.pk, status__in=ACTIVE).aggregate(
            n=Count("pk"), p=Sum("progress")
        )
        percent, message = placed(band, total, active["n"], active["p"] or 0)
        hold(job, token, percent=percent, message=message, step=row.name)
        move_step(
            job.pk,
            row.name,
            "resume_wait",
            actor=actor_of(job),
            job_status=Status.PROCESSING,
            fields={"attempts": F("attempts") + 1, "finished_at": None, "error_message": ""},
            metadata={"children": len(row.detail.get("children", [])), "resumed": True},
            requested="wait in it again",
            now=now,
        )
    row.status, row.attempts, row.finished_at, row.error_message = S.WAITING, row.attempts + 1, None, ""


def placed(band: Sequence[float], total: int, active: int, progress: int) -> tuple[float, str]:
    """The job's progress (and message) for a step waiting for its ``total`` children,
    ``active`` of which are still queued or running, their progress summing
    ``progress``: the step's ``band`` of the job's progress, filled as they finish."""
    if not total:
        return band[0], "waiting for child jobs"
    done = max(0, total - active)
    fraction = min(1.0, (done * 100 + progress) / (total * 100))
    return band[0] + (band[1] - band[0]) * fraction, f"{done} of {total} child jobs finished"


def children_of(job_id: Any, name: str) -> list[str]:
    """Ids of the child jobs step ``name`` started, in start order."""
    detail = JobStep.objects.filter(job_id=job_id, name=name).values_list("detail", flat=True).first()
    return list((detail or {}).get("children", []))
