"""The children a retried fan-out step takes over from the run it retries.

When a retry of a workflow (``services.retry``, ``retry_from``) spawns a fan-out
step's children, each spawn whose kind and parameters equal those of a child that
completed in the earlier run takes that child instead of starting a new one: the
fan-in adopts its stored result, at the new spawn's place. A spawn whose earlier
child failed, was cancelled, ended partial, is gone (retention) or never existed
starts a new child. When there was such an earlier child (failed, cancelled or
partial), the new one is its retry (``retry_of``, as ``services.retry`` makes): a
child that is itself a workflow then applies this rule one level down, and reuses
the completed children of its own fan-out steps.

Children are matched by the work they were asked for (kind and parameters), never by
position: when the step's items changed between the runs (rows added, removed or
reordered in a QuerySet), a new item is never handed another item's result. Equal
spawns take equal earlier children in their earlier order.

The earlier run is the nearest job up the retry chain (``retry_of``) whose step of
that name started children (a retry that skipped the step, or failed before it, is
looked past). Nothing is reused, and no new child is a retry, when a job on the way
completed (retrying a completed workflow runs it all again), nor from a step that
compensation undid (or tried to: its children's effects may be undone). An earlier
child that has a retry already (a job is retried once) is retried by none.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from jobstate.models import Job, JobStep
from jobstate.models.step import StepStatus
from jobstate.states import Status
from jobstate.workflows.fanout import retried, rows_of
from jobstate.workflows.spawns import CHUNK, ChildSpec, Reuse
from jobstate.workflows.steps import UNDO_ERROR

# The earlier children a new spawn retries: those that ended without completing.
RETRIED = (Status.FAILED, Status.CANCELLED, Status.PARTIAL)


def plan(job: Job, name: str, spawned: Sequence[ChildSpec]) -> Reuse:
    """Which of ``spawned`` (step ``name`` of ``job``) take an earlier child, and
    which of the others retry one."""
    earlier = _earlier(job.retry_of_id, name) if spawned else None
    if earlier is None:
        return Reuse()
    source, ids = earlier
    done, undone = _ended(ids)
    if not done and not undone:
        return Reuse()
    picks: list[str | None] = []
    retries: list[str | None] = []
    for child in spawned:
        key = _key(child.kind, child.parameters)
        pick = _take(done, key)
        picks.append(pick)
        retries.append(_take(undone, key) if pick is None else None)
    return Reuse(source, tuple(picks), tuple(retries))


def _take(pool: dict[tuple[str, str], deque[str]], key: tuple[str, str]) -> str | None:
    found = pool.get(key)
    return found.popleft() if found else None


def _earlier(pk: Any, name: str) -> tuple[str, list[str]] | None:
    """The nearest job up the chain from ``pk`` whose step ``name`` started children,
    and their ids; None if there is none usable."""
    seen = set()
    while pk is not None and pk not in seen:
        seen.add(pk)
        job = Job.objects.filter(pk=pk).values_list("status", "retry_of_id").first()
        if job is None or job[0] == Status.COMPLETED:
            return None
        row = JobStep.objects.filter(job_id=pk, name=name).values_list("status", "detail").first()
        if row is not None and "children" in (row[1] or {}):
            status, detail = row
            if status == StepStatus.UNDONE or "undone_at" in detail or UNDO_ERROR in detail:
                return None
            return str(pk), list(detail["children"])
        pk = job[1]
    return None


def _ended(ids: list[str]) -> tuple[dict[tuple[str, str], deque[str]], dict[tuple[str, str], deque[str]]]:
    """Those of ``ids`` that completed, and those that ended otherwise (failed,
    cancelled, partial) with no retry yet, each by their work, in order; a child that
    did not complete stands for its newest operator retry, as in the fan-in."""
    fields = ("kind", "parameters", "status", "parent_id")
    found = {str(r["pk"]): r for r in rows_of(ids, fields)}
    unfinished: dict[Any, list[str]] = defaultdict(list)
    for pk, row in found.items():
        if row["status"] != Status.COMPLETED and row["parent_id"] is not None:
            unfinished[row["parent_id"]].append(pk)
    replaced: dict[str, str] = {}
    for parent, group in unfinished.items():
        replaced.update(retried(parent, group))
    found.update((str(r["pk"]), r) for r in rows_of(list(replaced.values()), fields))
    current = [pk for pk in dict.fromkeys(replaced.get(pk, pk) for pk in ids) if pk in found]
    taken = _with_retry([pk for pk in current if found[pk]["status"] in RETRIED])
    done: dict[tuple[str, str], deque[str]] = defaultdict(deque)
    undone: dict[tuple[str, str], deque[str]] = defaultdict(deque)
    for pk in current:
        child = found[pk]
        if child["status"] == Status.COMPLETED:
            done[_key(child["kind"], child["parameters"])].append(pk)
        elif child["status"] in RETRIED and pk not in taken:
            undone[_key(child["kind"], child["parameters"])].append(pk)
    return done, undone


def _with_retry(ids: list[str]) -> set[str]:
    """Those of ``ids`` that some job retries already."""
    taken: set[str] = set()
    for i in range(0, len(ids), CHUNK):
        chunk = [uuid.UUID(pk) for pk in ids[i : i + CHUNK]]
        rows = Job.objects.filter(retry_of_id__in=chunk).values_list("retry_of_id", flat=True)
        taken.update(str(pk) for pk in rows)
    return taken


def _key(kind: str, parameters: Any) -> tuple[str, str]:
    return kind, json.dumps(parameters, sort_keys=True, cls=DjangoJSONEncoder)
