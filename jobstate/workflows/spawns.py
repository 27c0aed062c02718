"""The child jobs a fan-out step asks for (``StepContext.spawn``), and those it asked
for while walking its items with ``ctx.iterate``/``ctx.batches``.

A step's children are started only when it returns (``step_waits.wait``), but a checkpoint
of its iteration commits before that: a resume goes on after the items it counts.
So each such checkpoint also stores, in the same transaction, the spawns the iteration
made for the items it moves past, and a resumed iteration takes them back
(``restored``) in place of the items it does not walk again. Each item gets exactly
one child: the spawns of the items after the last checkpoint were never stored, and
those items are walked again. ``step_waits.wait`` drops them once the children exist.

The spawns are rows (``JobStepSpawn``), and a checkpoint adds only those made since
the previous one (``Stored``): rewriting the whole list at each checkpoint cost a step
that spawns a child per item time and bytes that grew with the square of its items
(500 checkpoints of 50,000 spawns wrote 411 MB). The step's ``detail`` keeps a small
entry (``SPAWNED``): the cursor of the checkpoint that stored them, and how many.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobstate.models import JobStepSpawn
from jobstate.services.bulk import Child
from jobstate.storable import json_value

# Keys of ``JobStep.detail``: REUSED, a fan-out step's children reused from an earlier
# run (``jobstate.workflows.reuse``); SPAWNED, ``{"at": cursor, "count": n}``: the
# iteration's first n spawns are stored, with the checkpoint of that cursor (a
# release before the rows kept them there too, as ``"children"``).
REUSED = "reused"
SPAWNED = "spawned"
CHUNK = 500  # ids per IN (...) query


@dataclass(frozen=True)
class ChildSpec:
    """A child job a fan-out step asked for (see ``StepContext.spawn``). ``checked``:
    the child as ``services.checked_child`` validated it in this attempt (None for
    one taken back from a checkpoint, validated again when it starts)."""

    kind: str
    parameters: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    checked: Child | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Reuse:
    """For each spawn of a fan-out step, in order, the earlier run's completed child
    it takes, or None to start a new one; and for each new one, the earlier child that
    did not complete which it retries (``retry_of``), or None
    (``jobstate.workflows.reuse``)."""

    source: str = ""  # the earlier job whose step started those children
    picks: tuple[str | None, ...] = ()
    retries: tuple[str | None, ...] = ()

    @property
    def jobs(self) -> list[str]:
        return [pk for pk in self.picks if pk is not None]

    @property
    def retried(self) -> list[str]:
        return [pk for pk in self.retries if pk is not None]

    def note(self) -> dict[str, Any]:
        """The step's ``detail`` entry, shown in its fan-in output too (empty when
        nothing is reused)."""
        return {REUSED: {"from": self.source, "jobs": self.jobs}} if self.jobs else {}


@dataclass(frozen=True)
class Stored:
    """What the checkpoint of cursor ``at`` stores of its iteration's spawns: ``new``,
    those from the ``first``-th on (the ones before are stored already). ``fresh``: the
    attempt's first such checkpoint, which drops anything an earlier attempt stored
    from ``first`` on (taken at another cursor, it was not taken back)."""

    at: int
    first: int
    new: list[ChildSpec]
    fresh: bool

    def entry(self) -> dict[str, Any]:
        """The step's ``SPAWNED`` entry once they are stored."""
        return {SPAWNED: {"at": self.at, "count": self.first + len(self.new)}}


def save(job_id: Any, step: str, stored: Stored) -> None:
    """Store ``stored`` (inside the transaction of its checkpoint)."""
    if stored.fresh:
        JobStepSpawn.objects.filter(job_id=job_id, step=step, position__gte=stored.first).delete()
    if not stored.new:
        return
    values = json_value([[c.kind, c.parameters, _options(c.options)] for c in stored.new], "detail")
    JobStepSpawn.objects.bulk_create(
        JobStepSpawn(job_id=job_id, step=step, position=i, kind=kind, parameters=parameters, options=options)
        for i, (kind, parameters, options) in enumerate(values, start=stored.first)
    )


def drop(job_id: Any, step: str) -> None:
    """The step's children exist: its stored spawns go (inside that transaction)."""
    JobStepSpawn.objects.filter(job_id=job_id, step=step).delete()


def restored(job_id: Any, step: str, detail: dict[str, Any], at: int) -> tuple[list[ChildSpec], int]:
    """The spawns stored with the checkpoint of cursor ``at`` (none if it stored none),
    and how many of them are rows (none of an older release's entry, which held them)."""
    entry = detail.get(SPAWNED)
    if not isinstance(entry, dict) or entry.get("at") != at:
        return [], 0
    if "children" in entry:
        return [_spec(*child) for child in entry["children"]], 0
    rows = (
        JobStepSpawn.objects.filter(job_id=job_id, step=step, position__lt=entry.get("count", 0))
        .order_by("position")
        .values_list("kind", "parameters", "options")
    )
    children = [_spec(*row) for row in rows]
    return children, len(children)


def _spec(kind: str, parameters: dict[str, Any], options: dict[str, Any]) -> ChildSpec:
    if options.get("run_after") is not None:
        options = {**options, "run_after": datetime.fromisoformat(options["run_after"])}
    return ChildSpec(kind, parameters, options)


def _options(options: dict[str, Any]) -> dict[str, Any]:
    # run_after to the microsecond (the JSON encoder would cut it to milliseconds).
    when = options.get("run_after")
    return {**options, "run_after": when.isoformat()} if isinstance(when, datetime) else options
