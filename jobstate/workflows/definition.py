"""Declaring a workflow: a class whose ``@step`` methods run in the order they are written.

    @jobstate.workflow("etl.daily", max_attempts=3)
    class DailyETL(jobstate.Workflow):
        @jobstate.step()
        def download(self, ctx): ...

        @jobstate.step(undo="undo_process", batch=100)
        def process(self, ctx, download): ...   # ``download`` is that step's output

``jobstate.workflow`` (:mod:`jobstate.workflows.registration`) registers the class
as an ordinary handler under its name; the handler runs the workflow through
:mod:`jobstate.workflows.runtime`, whose run each step sees as a ``RunState``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, overload

from jobstate import registry

if TYPE_CHECKING:  # types only: the worker is an independent layer
    from uuid import UUID

    from jobstate.models import Job
    from jobstate.worker.context import JobContext

CHILD_POLICIES = ("fail", "partial", "continue")
_MARK = "_jobstate_step"


@dataclass(frozen=True)
class StepSpec:
    """One declared step. ``inputs`` are earlier steps whose outputs the method
    takes as keyword arguments (``all_inputs``: it takes ``**outputs``)."""

    name: str
    method: str
    position: int
    undo: str | None = None
    batch: int | None = None
    on_child_failure: str = "fail"
    collect_results: bool = True
    inputs: tuple[str, ...] = ()
    all_inputs: bool = False


@dataclass(frozen=True)
class _Mark:
    name: str | None
    undo: str | Callable[..., Any] | None
    batch: int | None
    on_child_failure: str
    collect_results: bool


M = TypeVar("M", bound=Callable[..., Any])


@overload
def step(name: M, /) -> M: ...


@overload
def step(
    name: str | None = None,
    *,
    undo: str | Callable[..., Any] | None = None,
    batch: int | None = None,
    on_child_failure: str = "fail",
    collect_results: bool = True,
) -> Callable[[M], M]: ...


def step(
    name: str | Callable[..., Any] | None = None,
    *,
    undo: str | Callable[..., Any] | None = None,
    batch: int | None = None,
    on_child_failure: str = "fail",
    collect_results: bool = True,
) -> Any:
    """Mark a method of a :class:`Workflow` as its next step.

    ``undo``: a method (or its name) called as ``undo(self, ctx, output)`` when the
    workflow fails for good after this step completed. ``batch``: default checkpoint
    interval of ``ctx.iterate`` / ``ctx.batches`` in this step. ``on_child_failure``:
    what a failed or cancelled child job (see ``ctx.spawn``) does to the workflow:
    ``"fail"`` it, make it ``"partial"``, or ``"continue"``. ``collect_results``:
    put the children's results in the step's output.
    """
    if callable(name):  # used bare: @step
        return step()(name)
    if on_child_failure not in CHILD_POLICIES:
        raise ValueError(f"on_child_failure must be one of {CHILD_POLICIES}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError("batch must be a positive integer")

    def mark(func: M) -> M:
        setattr(func, _MARK, _Mark(name, undo, batch, on_child_failure, collect_results))
        return func

    return mark


class Workflow:
    """Base class of workflows. ``steps`` is filled in from the ``@step`` methods.

    One instance runs one attempt: state kept on ``self`` does not survive a crash;
    keep it in step outputs and checkpoints instead.
    """

    steps: ClassVar[tuple[StepSpec, ...]] = ()
    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        marked: dict[str, tuple[Callable[..., Any], _Mark]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                mark = getattr(value, _MARK, None)
                if isinstance(mark, _Mark):
                    marked[attr] = (value, mark)  # an override keeps its original place
        specs: list[StepSpec] = []
        for position, (attr, (func, mark)) in enumerate(marked.items()):
            specs.append(_spec(cls, attr, func, mark, position, [s.name for s in specs]))
        _plain(f"{cls.__qualname__}.result", cls.result, "result")
        cls.steps = tuple(specs)

    def result(self, outputs: dict[str, Any]) -> Any:
        """The job's result once every step is done: by default the last step's output."""
        return outputs.get(self.steps[-1].name) if self.steps else None

    @classmethod
    def step_named(cls, name: str) -> StepSpec:
        for spec in cls.steps:
            if spec.name == name:
                return spec
        raise KeyError(name)


def _plain(where: str, func: Any, what: str) -> None:
    """Refuse an ``async def`` method: the run calls it as a plain one, so its body
    would never run (a step's coroutine stored as its output fails every run; an
    undo's would be recorded as done), as ``jobstate.handler`` refuses one."""
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{where}: {what} is an async function; workflow methods are plain defs (run a "
            "coroutine inside one with asgiref.sync.async_to_sync)"
        )


def _spec(
    cls: type, attr: str, func: Callable[..., Any], mark: _Mark, position: int, earlier: list[str]
) -> StepSpec:
    name = mark.name or attr
    where = f"{cls.__qualname__}.{attr}"
    if not name or len(name) > 200 or name in earlier:
        raise TypeError(f"{where}: step names are unique, non-empty, at most 200 characters")
    _plain(where, func, "the step")
    if hasattr(Workflow, attr):  # the run calls result(); cls.steps replaces a method
        raise TypeError(f"{where}: '{attr}' is a Workflow attribute; give the step method another name")
    undo = mark.undo
    if callable(undo):
        undo = undo.__name__
    if undo is not None and hasattr(Workflow, undo):
        raise TypeError(f"{where}: undo method '{undo}' is a Workflow attribute; give it another name")
    if undo is not None and not callable(getattr(cls, undo, None)):
        raise TypeError(f"{where}: undo method '{undo}' is not defined on the class")
    if undo is not None:
        _plain(where, getattr(cls, undo), f"undo method '{undo}'")
    params = list(inspect.signature(func).parameters.values())[2:]  # after self, ctx
    inputs: list[str] = []
    all_inputs = False
    for param in params:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            all_inputs = True
        elif param.name in earlier:
            inputs.append(param.name)
        elif param.default is inspect.Parameter.empty and param.kind is not inspect.Parameter.VAR_POSITIONAL:
            known = ", ".join(earlier) or "-"
            raise TypeError(f"{where}: argument '{param.name}' names no earlier step (earlier: {known})")
    return StepSpec(
        name=name,
        method=attr,
        position=position,
        undo=undo,
        batch=mark.batch,
        on_child_failure=mark.on_child_failure,
        collect_results=mark.collect_results,
        inputs=tuple(inputs),
        all_inputs=all_inputs,
    )


class RunState(Protocol):
    """What a run of a workflow (``jobstate.workflows.runtime.Run``) shows the step
    context, fan-out and compensation it drives."""

    wf: Workflow
    ctx: JobContext
    job: Job
    token: UUID
    specs: tuple[StepSpec, ...]
    rows: dict[str, Any]
    outputs: dict[str, Any]

    def band(self, spec: StepSpec) -> tuple[float, float]: ...


def definition_of(kind: str) -> type[Workflow] | None:
    """The workflow class registered under ``kind``, or None for a plain handler."""
    spec = registry.all_handlers().get(kind)
    return spec.options.get("workflow") if spec is not None else None


def undoes_on_cancel(kind: str) -> bool:
    """Whether the workflow registered under ``kind`` compensates when cancelled
    (``@jobstate.workflow(..., undo_on_cancel=True)``)."""
    spec = registry.all_handlers().get(kind)
    return spec is not None and bool(spec.options.get("undo_on_cancel"))
