"""Fan-out and fan-in: a step starts child jobs and the workflow waits for them
without holding a worker.

``start`` creates the children and marks the step ``waiting`` in one transaction,
then raises ``Suspend``: the runner puts the job back in the queue without
spending an attempt, and the transaction that ends its last active child wakes
it. ``fan_in`` then sums the children up as the step's output, applying the
step's ``on_child_failure`` policy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jobstate import hooks
from jobstate.exceptions import NonRetryable, Suspend
from jobstate.models import Job, JobStep
from jobstate.models.step import StepStatus
from jobstate.states import ACTIVE, Status
from jobstate.workflows import step_waits, steps
from jobstate.workflows.context import StepContext
from jobstate.workflows.spawns import CHUNK, REUSED, Reuse

if TYPE_CHECKING:
    from jobstate.workflows.definition import RunState, StepSpec

MAX_FAILURES_LISTED = 20
NAMED_IN_ERROR = 3  # failed children the error names (the step's output lists up to 20)


class ChildrenFailed(NonRetryable):
    """A fan-out step whose policy is ``fail`` had a child that failed or was cancelled.
    ``output``: the fan-in's summary (``jobs``, counts, ``failures``), stored on the failed step."""

    def __init__(self, message: str, output: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.output = output


def _named(shown: list[dict[str, Any]], bad: int) -> str:
    """``<id> failed (ValueError: boom), <id> cancelled; and 4 more``: the first few
    children that failed or were cancelled, each error cut short."""
    parts = []
    for f in shown:
        error = " ".join(f"{f['error_type']}: {f['error']}".strip(": ").split())
        parts.append(f"{f['job']} {f['status']}" + (f" ({error[:100]})" if error else ""))
    more = bad - len(shown)
    return ", ".join(parts) + (f"; and {more} more" if more > 0 else "")


def start(run: RunState, spec: StepSpec, sctx: StepContext, value: Any, reuse: Reuse | None = None) -> None:
    """``reuse``: the earlier run's completed children the spawns take (``workflows.reuse``)."""
    children = step_waits.wait(
        run.job, run.token, spec.name, sctx.spawned, value=value, band=run.band(spec), reuse=reuse
    )
    taken = len(reuse.jobs) if reuse is not None else 0
    raise Suspend(
        f"step '{spec.name}' waits for {len(children)} child jobs" + (f" ({taken} reused)" if taken else "")
    )


def is_waiting(row: Any) -> bool:
    """Has the step's fan-out committed (its children exist and it waits for them)?"""
    return JobStep.objects.filter(pk=row.pk, status=StepStatus.WAITING).exists()


def waiting_progress(waiting: hooks.Waiting) -> tuple[int, str] | None:
    """The ``hooks.waiting_progress`` answer for a workflow waiting in a fan-out step:
    its children's progress placed within the step's share of the workflow."""
    band, total = (
        JobStep.objects.filter(job_id=waiting.job_id, status=StepStatus.WAITING)
        .values_list("detail__band", "detail__total")
        .first()
    ) or (None, None)
    if not band or not total:
        return None
    percent, message = step_waits.placed(band, total, waiting.active, waiting.progress)
    return int(percent), message


def rows_of(ids: list[str], fields: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    for i in range(0, len(ids), CHUNK):
        yield from Job.objects.filter(pk__in=ids[i : i + CHUNK]).values("pk", *fields)


def retried(parent_id: Any, ids: list[str]) -> dict[str, str]:
    """The newest retry (``services.retry``, a retry of a retry followed) of each of
    ``ids`` that an operator retried under the same parent: that retry stands for
    the child in the fan-in."""
    newest: dict[str, str] = {}
    looked, look = set(ids), ids
    while look:
        found: dict[str, str] = {}
        for i in range(0, len(look), CHUNK):
            chunk = [uuid.UUID(pk) for pk in look[i : i + CHUNK]]
            rows = (
                Job.objects.filter(parent_id=parent_id, retry_of_id__in=chunk)
                .order_by("created_at", "id")
                .values_list("retry_of_id", "pk")
            )
            found.update((str(old), str(new)) for old, new in rows)  # the newest retry of each wins
        newest.update(found)
        look = [new for new in found.values() if new not in looked]
        looked.update(look)
    latest = {}
    for pk in ids:
        current, seen = pk, {pk}
        while current in newest and newest[current] not in seen:
            current = newest[current]
            seen.add(current)
        if current != pk:
            latest[pk] = current
    return latest


def fan_in(run: RunState, spec: StepSpec, row: Any) -> dict[str, Any]:
    """The step's output once all its children ended (else wait again). A child
    that did not complete and that an operator retried counts by its newest retry
    (waited for while it runs)."""
    ids: list[str] = list(row.detail.get("children", []))
    fields = ("status", "error_type", "error_message") + (("result",) if spec.collect_results else ())
    by_id = {str(r["pk"]): r for r in rows_of(ids, fields)}
    unfinished = [
        pk for pk in ids if (by_id.get(pk) or {}).get("status", Status.CANCELLED) != Status.COMPLETED
    ]
    replaced = retried(run.job.pk, unfinished) if unfinished else {}
    if replaced:
        ids = [replaced.get(pk, pk) for pk in ids]
        by_id.update((str(r["pk"]), r) for r in rows_of(list(replaced.values()), fields))
    active = sum(1 for r in by_id.values() if r["status"] in ACTIVE)
    if active:
        raise Suspend(f"step '{spec.name}': {active} of {len(ids)} child jobs still running")
    counts = {s: 0 for s in (Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.CANCELLED)}
    failures: list[dict[str, Any]] = []
    named: list[dict[str, Any]] = []  # failed or cancelled, for ChildrenFailed
    for pk in ids:
        child = by_id.get(pk)
        status = child["status"] if child else Status.CANCELLED  # deleted meanwhile
        counts[status] = counts.get(status, 0) + 1
        if status == Status.COMPLETED or (
            len(failures) >= MAX_FAILURES_LISTED and len(named) >= NAMED_IN_ERROR
        ):
            continue
        failure = {
            "job": pk,
            "status": status,
            "error": (child or {}).get("error_message", ""),
            "error_type": (child or {}).get("error_type", ""),
        }
        if len(failures) < MAX_FAILURES_LISTED:
            failures.append(failure)
        if status != Status.PARTIAL and len(named) < NAMED_IN_ERROR:
            named.append(failure)
    output: dict[str, Any] = {
        "total": len(ids),
        **{str(k): v for k, v in counts.items()},
        "jobs": ids,
        **({"retried": replaced} if replaced else {}),
        **({REUSED: row.detail[REUSED]} if REUSED in row.detail else {}),
        "failures": failures,
        "value": row.detail.get("value"),
    }
    if spec.collect_results:
        output["results"] = [(by_id.get(pk) or {}).get("result") for pk in ids]
    bad = counts[Status.FAILED] + counts[Status.CANCELLED]
    partial = counts[Status.PARTIAL]
    summary = f"{bad + partial} of {len(ids)} child jobs did not complete"
    if spec.on_child_failure == "fail" and bad:
        raise ChildrenFailed(
            f"{bad} of {len(ids)} child jobs failed or were cancelled: {_named(named, bad)}", output
        )
    # The fan-in's note has a key of its own: the step body's (``ctx.mark_partial``) stays.
    if spec.on_child_failure != "continue" and (bad or partial):
        steps.note(run.job, run.token, spec.name, **{steps.FAN_IN_PARTIAL: summary})
    elif steps.FAN_IN_PARTIAL in row.detail:
        # An earlier fan-in's note, before a run that failed: the children it
        # counted out were retried since, and completed.
        steps.note(run.job, run.token, spec.name, **{steps.FAN_IN_PARTIAL: None})
    return output
