"""Checked by ``make typecheck`` (mypy, strict), never run: what a project's own
type checker sees of ``@jobstate.handler``, ``@jobstate.workflow`` and
``@jobstate.step``. Each keeps the decorated function's or class's own type: a
strict project's handlers and steps stay typed (``step`` returned ``Any``: strict
mypy refused every decorated step as an untyped decorator)."""

from __future__ import annotations

from typing import Any

import jobstate
from jobstate.worker.context import JobContext
from jobstate.workflows import StepContext


@jobstate.handler("typing.resize", max_attempts=3)
def resize(ctx: JobContext) -> dict[str, int]:
    return {"width": 1}


@jobstate.workflow("typing.nightly", max_attempts=2)
class Nightly(jobstate.Workflow):
    @jobstate.step(undo="forget", batch=100)
    def fetch(self, ctx: StepContext) -> list[int]:
        return [1, 2]

    @jobstate.step
    def total(self, ctx: StepContext, fetch: list[int]) -> int:
        return sum(fetch)

    def forget(self, ctx: StepContext, output: Any) -> None:
        return None


again: type[Nightly] = jobstate.workflow("typing.again")(Nightly)
width: dict[str, int] = resize(JobContext.__new__(JobContext))
resize("not a context")  # type: ignore[arg-type]
count: int = Nightly().total(StepContext.__new__(StepContext), [1])
Nightly().total(StepContext.__new__(StepContext), ["x"])  # type: ignore[list-item]
