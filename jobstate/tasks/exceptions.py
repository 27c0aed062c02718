"""Exception classes that name, in a ``TaskResult``'s ``errors``, the ways an
attempt can end that are not an exception raised by the task itself."""

from __future__ import annotations

from jobstate.exceptions import NonRetryable


class TaskTimeout(TimeoutError):
    """The attempt ran past the task's ``timeout`` (or the worker's hard limit)."""


class WorkerLost(Exception):
    """The worker running the attempt stopped heartbeating; the reaper took the job back."""


class OperatorRequeued(Exception):
    """An operator put the running job back in the queue (admin, API or command)."""


class OperatorFailed(Exception):
    """An operator ended the job ``failed``."""


class UnstorableResult(NonRetryable):
    """The task returned a value the database cannot store (not JSON, NaN, a NUL
    character...); it is not run again."""


class TaskUnavailable(ImportError):
    """``get_result`` of a job that was enqueued as a task whose task this process
    cannot find any more (renamed or removed from the code, or its module fails to
    import): the result exists, its task does not. An ``ImportError``, as
    django-tasks-db raises for a stored task path that no longer imports; not
    ``TaskResultDoesNotExist``, which says there is no such result."""

    def __init__(self, message: str, *, result_id: str, kind: str) -> None:
        super().__init__(message)
        self.result_id, self.kind = result_id, kind
