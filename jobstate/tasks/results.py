"""A jobstate ``Job`` (and its history) read as a Django ``TaskResult``.

Statuses: queued -> READY (new, or waiting for a retry), processing -> RUNNING,
waiting -> RUNNING (started, and waiting for its children or a time), completed
-> SUCCESSFUL, partial -> SUCCESSFUL with a ``jobstate.exceptions.Partial``
entry last in ``errors`` (the partial result is the ``return_value``), failed
and cancelled -> FAILED (a cancel adds a ``jobstate.exceptions.CancelRequested``
entry with its reason).

``errors`` holds one entry per attempt that did not succeed, in order, from the
job's history: the exception the task raised (class path and traceback), or the
way the attempt ended otherwise (timeout, worker lost, operator requeue or
fail, cancel).
"""

from __future__ import annotations

import builtins
import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Aggregate, Func, JSONField, OuterRef, QuerySet, Subquery
from django.db.models.functions import JSONArray
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobstate.models import Job, JobEvent
from jobstate.services.transitions import refunded
from jobstate.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus

STATUSES: dict[str, Any] = {
    "queued": TaskResultStatus.READY,
    "processing": TaskResultStatus.RUNNING,
    "waiting": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "partial": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}

# error_type values jobstate itself writes (no exception raised by the task).
SYNTHETIC = {
    "Timeout": "jobstate.tasks.exceptions.TaskTimeout",
    "HardTimeout": "jobstate.tasks.exceptions.TaskTimeout",
    "WorkerLost": "jobstate.tasks.exceptions.WorkerLost",
    "OperatorFailed": "jobstate.tasks.exceptions.OperatorFailed",
    "UnknownKind": "jobstate.exceptions.UnknownKind",
    "UnstorableResult": "jobstate.tasks.exceptions.UnstorableResult",
}
CANCELLED = "jobstate.exceptions.CancelRequested"
PARTIAL = "jobstate.exceptions.Partial"
REQUEUED = "jobstate.tasks.exceptions.OperatorRequeued"
ENDS_ATTEMPT = frozenset({"complete", "mark_partial", "fail", "requeue", "cancel"})

Row = tuple[str, str, str, dict[str, Any], Any]


def status_of(job_status: str) -> Any:
    return STATUSES[job_status]


def exception_path(error_type: str, traceback: str = "") -> str:
    """The dotted path of the exception class a task raised.

    jobstate stores the class's ``__name__``; the traceback's last header line
    (``module.Class: message``) gives its module, which Python leaves out for
    builtins. An exception group's header is indented (``  | module.Group: ...``;
    its sub-exceptions' deeper)."""
    if not error_type:
        return "builtins.Exception"
    header = re.compile(rf"^(?:  \| )?((?:[A-Za-z_]\w*\.)*){re.escape(error_type)}(?::|$)")
    for line in reversed(traceback.splitlines()):
        match = header.match(line)
        if match and match.group(1):
            return match.group(1) + error_type
        if match:
            break
    if isinstance(getattr(builtins, error_type, None), type):
        return f"builtins.{error_type}"
    return SYNTHETIC.get(error_type, error_type)


def _error(path: str, traceback: str, message: str) -> Any:
    return TaskError(exception_class_path=path, traceback=traceback or f"{path}: {message}\n")


def began(rows: list[Row]) -> list[Row]:
    """The history without the claims whose attempt was not spent: a job a cluster
    only reserved (requeued, failed or cancelled before a worker process began it),
    a worker handed back unstarted, one whose worker could not begin it or start its
    handler (requeued with that error, the attempt refunded), or one that gave its
    worker back (``Suspend``: the attempt is refunded). Such a claim counts in
    neither ``job.attempts`` nor ``context.attempt``, so it has no worker id or error
    here (the handler never ran); its requeue (or suspend) goes too (a cancel or a
    fail stays: it ended the job)."""
    kept: list[Row] = []
    claim: int | None = None
    for row in rows:
        transition, metadata = row[0], row[3] or {}
        if transition == "claim":
            claim = len(kept)
        elif claim is not None and (transition in ENDS_ATTEMPT or transition == "suspend"):
            unspent = refunded(metadata)
            if unspent:
                del kept[claim]
            claim = None
            if unspent and transition in ("requeue", "suspend"):
                continue
        kept.append(row)
    return kept


def errors_of(job: Job, rows: list[Row]) -> list[Any]:
    errors: list[Any] = []
    for transition, actor, reason, metadata, _at in rows:
        metadata = metadata or {}
        if transition in ("fail", "requeue") and "error_type" in metadata:
            error_type = metadata.get("error_type") or ""
            traceback = metadata.get("traceback") or ""
            path = exception_path(error_type, traceback)
            if not traceback and error_type in SYNTHETIC:
                path = SYNTHETIC[error_type]
            errors.append(_error(path, traceback, metadata.get("error") or reason))
        elif transition == "fail":
            errors.append(_error(SYNTHETIC.get(job.error_type, "builtins.Exception"), "", reason))
        elif transition == "requeue" and not refunded(metadata):
            path = SYNTHETIC["WorkerLost"] if actor == "system:reaper" else REQUEUED
            errors.append(_error(path, "", reason))
        elif transition == "cancel":
            errors.append(_error(CANCELLED, "", reason or "cancelled"))
        elif transition == "mark_partial":
            errors.append(_error(PARTIAL, "", reason or "partial"))
    return errors


def _worker(label: str) -> str:
    return label.split(":", 1)[1] if label.startswith("worker:") else label


def worker_ids_of(job: Job, rows: list[Row]) -> list[str]:
    """One id per attempt: the worker process that ended it (else the one that claimed it)."""
    ids: list[str] = []
    ended = True
    for transition, actor, _reason, _metadata, _at in rows:
        if transition == "claim":
            ids.append(_worker(actor))
            ended = False
        elif transition in ENDS_ATTEMPT and ids and not ended:
            ended = True
            if actor.startswith("worker:"):
                ids[-1] = _worker(actor)
    if ids and not ended and job.status == "processing" and job.worker_id:
        ids[-1] = job.worker_id
    return ids


class _JSONList(Aggregate):
    """The JSON array of an expression's values, in no set order (SQLite orders an
    aggregate's input from 3.44 only)."""

    function = "JSON_GROUP_ARRAY"
    output_field = JSONField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, function="JSONB_AGG", **extra_context)


class _Stored(Func):
    """A JSONField column as JSON inside a JSON array: SQLite stores it as text, which
    JSON_ARRAY would quote."""

    function = "JSON"
    output_field = JSONField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return compiler.compile(self.get_source_expressions()[0])


_HISTORY = "jobstate_task_history"
_UNREAD = object()


def with_history(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """``jobs``, each read with its history in the same statement: one committed state
    of both. Read in a second query, the history could be a later state's (a status
    from before an attempt ended with that attempt's error: a result that never was).
    On a database other than PostgreSQL and SQLite, ``history`` still queries it."""
    if connections[jobs.db].vendor not in ("postgresql", "sqlite"):
        return jobs
    rows = (
        JobEvent.objects.filter(job=OuterRef("pk"))
        .values("job")
        .annotate(
            rows=_JSONList(
                JSONArray("id", "transition", "actor_label", "reason", _Stored("metadata"), "created_at")
            )
        )
        .values("rows")
    )
    return jobs.annotate(**{_HISTORY: Subquery(rows)})


def history(job: Job) -> list[Row]:
    """The job's history: as ``with_history`` read it with the job, else queried now."""
    read: Any = getattr(job, _HISTORY, _UNREAD)
    if read is _UNREAD:
        return list(
            JobEvent.objects.filter(job_id=job.pk)
            .order_by("id")
            .values_list("transition", "actor_label", "reason", "metadata", "created_at")
        )
    connection = connections[job._state.db or DEFAULT_DB_ALIAS]
    return [
        (transition, actor, reason, metadata, _moment(created_at, connection))
        for _id, transition, actor, reason, metadata, created_at in sorted(read or [])
    ]


def _moment(text: str, connection: Any) -> datetime:
    """A time as the JSON of ``with_history`` gives it (ISO text), as Django reads the
    column: aware with ``USE_TZ`` (SQLite stores it naive, in the connection's time
    zone), else naive in that time zone."""
    moment = parse_datetime(text)
    if moment is None:
        raise ValueError(f"not a stored time: {text!r}")
    aware = timezone.is_aware(moment)
    if settings.USE_TZ:
        return moment if aware else timezone.make_aware(moment, connection.timezone)
    return timezone.make_naive(moment, connection.timezone) if aware else moment


def needs_history(job: Job) -> bool:
    """False when the row alone says everything: a job never claimed and still
    queued, or running its first attempt (begun; no attempt has ended yet)."""
    if job.status == "queued":
        return job.attempts > 0
    return not (job.status == "processing" and job.attempts == 1 and job.started_at is not None)


def as_begun(rows: list[Row], attempt: int) -> list[Row]:
    """The history as it stood when attempt number ``attempt`` began: without the
    row that ended it, nor any after it. Claims whose attempt was refunded (see
    ``began``) are not counted."""
    charged = 0
    claimed = False
    for index, row in enumerate(rows):
        transition, metadata = row[0], row[3] or {}
        if transition == "claim":
            charged, claimed = charged + 1, True
        elif claimed and (transition in ENDS_ATTEMPT or transition == "suspend"):
            claimed = False
            if refunded(metadata):
                charged -= 1
            elif charged >= attempt:
                return rows[:index]
    return rows


def started_result(job: Job, task: Task[..., Any]) -> Any:
    """The ``TaskResult`` of the attempt of ``job`` that is starting (what
    ``task_started`` carries); ``job`` is the row as that attempt's ``begin`` stored it.

    Its first attempt: that row says everything, no query. Else ``with_history``
    reads the job and its history in one statement, as ``get_result`` does. If the
    attempt was ended or taken since it began (an operator's requeue or fail, the
    reaper), that state is no longer this attempt's: the begun row goes with the
    history as it stood then (history rows are only ever added)."""
    if not needs_history(job):
        return build_result(job, task)
    read = with_history(Job.objects.filter(pk=job.pk)).first()
    if (
        read is not None
        and read.status == "processing"
        and read.lease_token == job.lease_token
        and read.started_at == job.started_at
    ):
        return build_result(read, task)
    rows = history(read) if read is not None else []
    return build_result(job, task, began(as_begun(rows, job.attempts)))


def build_result(job: Job, task: Task[..., Any], events: list[Row] | None = None) -> Any:
    """The ``TaskResult`` of ``job`` (its history is read unless ``events`` is given)."""
    if events is None:
        events = began(history(job)) if needs_history(job) else []
    claims = [row[4] for row in events if row[0] == "claim"]
    worker_ids = worker_ids_of(job, events)
    if not events and job.status == "processing":  # its first attempt, running
        claims, worker_ids = [job.started_at], [job.worker_id]
    # A job a cluster only reserved (no worker process began it yet) is not running,
    # and its latest claim began no attempt: no start, attempt or worker id of its own.
    reserved = job.status == "processing" and job.started_at is None
    if reserved:
        claims, worker_ids = claims[:-1], worker_ids[:-1]
    status = TaskResultStatus.READY if reserved else status_of(job.status)
    # The row's ``started_at`` is when the current attempt began (``begin``); a claim
    # is the reservation, a moment earlier. jobstate keeps the current attempt's start
    # only, so once a later attempt is claimed the first claim stands in for the first
    # attempt's start, and while a retry is only reserved the latest earlier claim
    # for the latest attempt's (docs/howto/django-tasks.md).
    first = job.started_at if job.attempts <= 1 and job.started_at else (claims[0] if claims else None)
    last = job.started_at or (claims[-1] if claims else None)
    parameters = job.parameters or {}
    result = TaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=job.created_at,
        started_at=first,
        last_attempted_at=last,
        finished_at=job.finished_at,
        args=list(parameters.get("args") or []),
        kwargs=dict(parameters.get("kwargs") or {}),
        backend=parameters.get("backend", "default"),
        errors=errors_of(job, events),
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result
