"""Registering a workflow class as a handler: ``@jobstate.workflow(name, ...)``.

Apart from :mod:`jobstate.workflows.definition` because the handler it registers
runs the workflow (:mod:`jobstate.workflows.runtime`), and the declarations must
not depend on the run. The runtime is imported when a run starts: ``jobstate``
re-exports this decorator and is imported before Django's apps are ready, and the
runtime loads the models.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from jobstate import registry
from jobstate.workflows.definition import Workflow

W = TypeVar("W", bound=type[Workflow])


class WorkflowDecorator(Protocol):
    """Registers the class and returns it, its type kept."""

    def __call__(self, cls: W, /) -> W: ...


def workflow(
    name: str,
    *,
    max_attempts: int | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    retry_backoff: Any = None,
    schema: Any = None,
    undo_on_cancel: bool = False,
    **options: Any,
) -> WorkflowDecorator:
    """Register a :class:`Workflow` subclass as the handler ``name`` (same options as
    ``jobstate.handler``; ``timeout`` applies to each run of the workflow, not to the
    whole: a workflow waiting for its children holds no worker).

    ``undo_on_cancel``: a cancel compensates, as a failure for good does: the undos
    of the completed steps run, last step first, before the job ends ``cancelled``
    (a waiting or queued job goes back to a worker for them)."""
    if not isinstance(undo_on_cancel, bool):
        raise TypeError(f"Workflow '{name}': undo_on_cancel must be True or False, not {undo_on_cancel!r}")

    def register(cls: W) -> W:
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise TypeError("@jobstate.workflow decorates a subclass of jobstate.Workflow")
        if not cls.steps:
            raise TypeError(f"{cls.__qualname__} declares no @step methods")

        def handle(ctx: Any) -> Any:
            from jobstate.workflows.runtime import run

            return run(cls, ctx)

        # The registry tells a re-registration apart from a clash by these names.
        handle.__qualname__ = cls.__qualname__
        handle.__module__ = cls.__module__
        handle.__doc__ = cls.__doc__
        registry.internal_handler(
            name,
            {"workflow": cls, "undo_on_cancel": undo_on_cancel},
            max_attempts=max_attempts,
            timeout=timeout,
            concurrency=concurrency,
            retry_backoff=retry_backoff,
            schema=schema,
            **options,
        )(handle)
        cls.kind = name
        return cls

    return register
