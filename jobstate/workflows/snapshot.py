"""The whole state of a workflow job as JSON, ``jobstate.workflows.state(job)``: its
steps (status, attempts, cursor, output, error, timestamps) and its children.
``manage.py jobstate_workflow state`` prints it; the REST API's job detail and the
admin's job page show the same step statuses (no children).

A step still ``running``, ``serving`` or ``waiting`` in a finished job (it was
cancelled, failed by the reaper or by an operator while the step was in progress)
is shown as ``interrupted``, its stored status kept as ``stored_status``
(``models.step.shown_status``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jobstate.models import Job, JobStep
from jobstate.models.step import StepStatus, shown_status
from jobstate.states import ACTIVE, Status
from jobstate.workflows.definition import definition_of
from jobstate.workflows.fanout import retried, rows_of
from jobstate.workflows.items import LOOP, READ_AFTER
from jobstate.workflows.spawns import SPAWNED
from jobstate.workflows.steps import PERCENT


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _step(
    row: JobStep, ids: list[str] | None, children: Mapping[str, Mapping[str, Any]], job_status: str
) -> dict[str, Any]:
    detail = dict(row.detail or {})
    detail.pop("children", None)
    detail.pop("band", None)
    detail.pop(READ_AFTER, None)
    detail.pop(LOOP, None)
    detail.pop(PERCENT, None)  # the step's progress at its checkpoint (``steps.resumed_percent``)
    detail.pop(SPAWNED, None)  # an iteration's spawns, not started yet (``workflows.spawns``)
    out: dict[str, Any] = {
        "name": row.name,
        "position": row.position,
        "status": row.status,
        "attempts": row.attempts,
        "cursor": row.cursor,
        "output": row.output,
        "error": row.error_message,
        "started_at": _when(row.started_at),
        "finished_at": _when(row.finished_at),
        "updated_at": _when(row.updated_at),
        "detail": detail,
    }
    shown = shown_status(row.status, job_status)
    if shown != row.status:
        out["status"], out["stored_status"] = shown, row.status
    if ids is not None:
        out["children"] = _summary([children[i] for i in ids if i in children], len(ids))
    return out


def _counted(job_id: Any, row: JobStep, kids: dict[str, Mapping[str, Any]]) -> list[str] | None:
    """The ids a fan-out step's children count by, as its fan-in counts them: a child
    that did not complete and that an operator retried under the same parent stands
    for its newest retry (whose row is added to ``kids``)."""
    ids: list[str] | None = row.detail.get("children")
    if not ids:
        return ids
    unfinished = [i for i in ids if (kids.get(i) or {}).get("status") != Status.COMPLETED]
    replaced = retried(job_id, unfinished) if unfinished else {}
    missing = [new for new in replaced.values() if new not in kids]
    kids.update({str(r["pk"]): r for r in rows_of(missing, ("status", "progress"))})
    return [replaced.get(i, i) for i in ids]


def _summary(rows: list[Mapping[str, Any]], total: int) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    done = 0
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        # An active child (a nested workflow waiting for its own children too) counts
        # its progress; an ended one 100 %.
        done += r["progress"] if r["status"] in ACTIVE else 100
    return {"total": total, "by_status": by_status, "progress": round(done / total, 1) if total else None}


def state(job: Job | Any) -> dict[str, Any]:
    """JSON-ready state of ``job``. Works for any job; ``workflow`` is False (and
    ``steps`` empty) for plain handlers. A job that has not run yet lists its
    declared steps as ``pending``."""
    job = job if isinstance(job, Job) else Job.objects.get(pk=job)
    cls = definition_of(job.kind)
    rows = list(JobStep.objects.filter(job_id=job.pk).order_by("position"))
    kids: dict[str, Mapping[str, Any]] = {
        str(r["pk"]): r for r in Job.objects.filter(parent_id=job.pk).values("pk", "status", "progress")
    }
    own = dict(kids)
    # Steps copied into a retry list the children of the job they came from; a
    # retry's fan-out step lists the earlier run's children it reused.
    borrowed = [i for r in rows for i in r.detail.get("children", ()) if i not in kids]
    kids.update({str(r["pk"]): r for r in rows_of(borrowed, ("status", "progress"))})
    counted = {r.name: _counted(job.pk, r, kids) for r in rows}
    if rows:
        step_list = [_step(r, counted[r.name], kids, job.status) for r in rows]
    elif cls is not None:
        blank = [JobStep(job_id=job.pk, name=s.name, position=s.position) for s in cls.steps]
        step_list = [_step(r, None, kids, job.status) for r in blank]
    else:
        step_list = []
    waiting = job.status == Status.WAITING
    progress = float(job.progress)
    if waiting:  # live: children's progress within the waiting step's share
        for row in rows:
            band, ids = row.detail.get("band"), counted[row.name]
            if row.status == StepStatus.WAITING and band and ids:
                share = _summary([kids[i] for i in ids if i in kids], len(ids))["progress"] or 0
                progress = round(band[0] + (band[1] - band[0]) * share / 100, 1)
    return {
        "job": str(job.pk),
        "kind": job.kind,
        "workflow": cls is not None,
        "status": job.status,
        "waiting_for_children": waiting,
        "current_step": job.current_step,
        "progress": progress,
        "progress_message": job.progress_message,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "stop_requested_at": _when(job.stop_requested_at),
        "serving": any(s["status"] == StepStatus.SERVING for s in step_list),
        "retry_of": str(job.retry_of_id) if job.retry_of_id else None,
        "steps": step_list,
        "undone": [s["name"] for s in step_list if s["status"] == StepStatus.UNDONE],
        "children": _summary(list(own.values()), len(own)),
    }
