"""The child jobs a fan-out step asks for (``StepContext.spawn``), and those it asked
for while walking its items with ``ctx.iterate``/``ctx.batches``.

A step's children are started only when it returns (``steps.wait``), but a checkpoint
of its iteration commits before that: a resume goes on after the items it counts.
So each such checkpoint also stores, in the step's ``detail`` (as ``SPAWNED``), the
spawns the iteration made for the items it moves past, and a resumed iteration takes
them back (``restored``) in place of the items it does not walk again. Each item gets
exactly one child: the spawns of the items after the last checkpoint were never
stored, and those items are walked again. ``steps.wait`` drops the entry once the
children exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Keys of ``JobStep.detail``: REUSED, a fan-out step's children reused from an earlier
# run (``jobstate.workflows.reuse``); SPAWNED, the spawns of its iteration so far.
REUSED = "reused"
SPAWNED = "spawned"
CHUNK = 500  # ids per IN (...) query


@dataclass(frozen=True)
class ChildSpec:
    """A child job a fan-out step asked for (see ``StepContext.spawn``)."""

    kind: str
    parameters: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


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


def stored(spawned: list[ChildSpec], at: int) -> dict[str, Any]:
    """The ``SPAWNED`` entry: ``spawned`` (the iteration's, in order), made for its
    items before the ``at``-th (the cursor the checkpoint stores with it)."""
    return {"at": at, "children": [[c.kind, c.parameters, _options(c.options)] for c in spawned]}


def restored(detail: dict[str, Any], at: int) -> list[ChildSpec]:
    """The spawns stored with the checkpoint of cursor ``at`` (none if it stored none)."""
    entry = detail.get(SPAWNED)
    if not isinstance(entry, dict) or entry.get("at") != at:
        return []
    children = []
    for kind, parameters, options in entry["children"]:
        if options.get("run_after") is not None:
            options = {**options, "run_after": datetime.fromisoformat(options["run_after"])}
        children.append(ChildSpec(kind, parameters, options))
    return children


def _options(options: dict[str, Any]) -> dict[str, Any]:
    # run_after to the microsecond (the JSON encoder would cut it to milliseconds).
    when = options.get("run_after")
    return {**options, "run_after": when.isoformat()} if isinstance(when, datetime) else options
