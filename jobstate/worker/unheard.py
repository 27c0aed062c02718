"""Writes that committed but whose answer the worker never heard: the server
dropped the connection between the commit and the reply, and the write made once
more on a new one (``connections.reconnecting``) was refused because the first
had already landed. What the first one did is read back from the database, and
only what this worker process did is taken up: by its worker id, at the instant
of that write, and (where it is known) under its lease token. An attempt's
outcome write cut short (the connection dropped, or a Ctrl-C) is read back the
same way (``stored_outcome``)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from jobstate.worker.context import JobContext

logger = logging.getLogger("jobstate.worker")


def begun(job_id: Any, worker_id: str, since: datetime, token: Any = None) -> Job | None:
    """The job ``worker_id`` began by a ``begin`` (``token``: the lease it was
    begun under) or a ``start`` (which made the token) called at ``since``, whose
    answer was lost: it is still ``processing``, held by this worker process,
    started since. None if it is not (another holder has it, or it moved on)."""
    held = Job.objects.filter(
        pk=job_id, status=Status.PROCESSING, worker_id=worker_id[:200], started_at__gte=since
    )
    if token is not None:
        held = held.filter(lease_token=token)
    try:
        job = held.first()
    except Exception:
        logger.warning("Job %s: could not read whether this worker began it", job_id, exc_info=True)
        return None
    if job is not None:
        logger.info("Job %s: begun before the connection dropped; it runs", job_id)
    return job


def handed_over(completed: Any, request: services.NextClaim) -> None:
    """The completion of ``completed`` that committed unheard may have claimed
    and begun ``request``'s next job in the same statement (``services.handover``):
    that job, if one was, goes into ``request`` as if the answer had come, for the
    worker to run. It was claimed for this worker process at the completion's
    instant (its history row and ``started_at`` carry it); the lease token is the
    one that statement stored. Nothing found: ``request`` stays untried, and the
    worker claims its next job itself."""
    label = services.Actor.worker(request.worker_id).label[:200]
    try:
        finished = Job.objects.filter(pk=completed, status=Status.COMPLETED).values_list(
            "finished_at", flat=True
        )
        claim = JobEvent.objects.filter(
            job_id=OuterRef("pk"), transition="claim", actor_label=label, created_at=OuterRef("started_at")
        )
        job = (
            Job.objects.filter(
                Exists(claim),
                status=Status.PROCESSING,
                worker_id=request.worker_id[:200],
                started_at__in=finished,
            )
            .order_by("id")
            .first()
        )
    except Exception:
        logger.warning(
            "Job %s: could not read whether its completion claimed a job; one it did is left to the reaper",
            completed,
            exc_info=True,
        )
        return
    if job is not None:
        logger.info(
            "Job %s: claimed with the outcome of job %s before the connection dropped", job.pk, completed
        )
        request.claimed, request.tried = [job], True


# What an attempt's outcome write stored, by the status its history row moved the job to.
_STORED: dict[str, str] = {
    Status.COMPLETED: "completed",
    Status.PARTIAL: "partial",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
    Status.WAITING: "suspended",
}


def stored_outcome(ctx: JobContext) -> str:
    """The outcome this attempt stored before a Ctrl-C cut its write short (the
    hand-back was refused: the job had left ``processing``), or before the
    connection dropped (``finish``'s write made again was refused), as ``finish``
    would have returned it: read from the history row the write made in its
    transaction (by this worker, since the attempt began). "lost" if there is
    none: the lease was lost (the reaper, another holder, an operator moved it)."""
    job = ctx.job
    mine = JobEvent.objects.filter(
        job_id=job.pk,
        from_status=Status.PROCESSING,
        actor_label=services.Actor.worker(ctx.worker_id).label[:200],
    )
    if job.started_at is not None:
        mine = mine.filter(created_at__gte=job.started_at)
    try:
        row = mine.order_by("-id").values_list("to_status", "metadata").first()
    except Exception:
        logger.warning("Job %s: could not read what its attempt stored", job.pk, exc_info=True)
        return "lost"
    if row is None:
        return "lost"
    status, metadata = row
    if status == Status.QUEUED:  # a retry records its error; a suspend(until=) is marked
        if metadata.get("suspended"):
            return "suspended"
        return "retrying" if "error" in metadata else "lost"
    return _STORED.get(status, "lost")
