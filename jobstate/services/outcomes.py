"""The calls that end an attempt: complete, mark_partial, fail.

Like every call after the claim they carry the lease token; a stale worker's
call matches no row and is refused with ``LeaseLost``, changing nothing.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobstate import registry
from jobstate.exceptions import InvalidTransition, LeaseLost
from jobstate.models import Job
from jobstate.retry import backoff_seconds, bounded
from jobstate.services import handover, setup_failures
from jobstate.services._rows import create_job as _create
from jobstate.services._writes import Col, checked_now
from jobstate.services.actors import Actor
from jobstate.services.handover import NextClaim
from jobstate.services.lease import JobRef, _pk
from jobstate.services.transitions import held, move, parent_locked
from jobstate.states import Status
from jobstate.storable import result_value, text

logger = logging.getLogger("jobstate")


def complete(
    job: JobRef,
    token: UUID | str,
    result: Any = None,
    *,
    actor: Actor | None = None,
    reason: str = "",
    progress: dict[str, Any] | None = None,
    now: datetime | None = None,
    then: NextClaim | None = None,
) -> Job | None:
    """End the job ``completed`` with ``result``.

    ``progress``: progress fields not yet written (a coalesced
    ``ctx.progress``; see ``lease.progress_fields``), stored with the outcome
    (the percent is 100 whatever they say).

    The job records the watermark its attempt was claimed at (stored by the
    claim, whatever the caller's copy says) as its last successful one. With a
    key, if the watermark was raised while it ran, a follow-up job with the same
    key is queued in the same transaction (the input is dirty).

    ``then``: a worker process going on to its next job; where the two can be one
    statement (``handover``), that job is claimed with this outcome and put in
    ``then.claimed``; elsewhere nothing is claimed.

    A ``token`` of None is refused (``LeaseLost``), nothing written. ``now``
    (None: the clock) is timezone-aware with ``USE_TZ = True``, else ``ValidationError``.
    """
    now = checked_now(now)
    token = held(_pk(job), token, "complete")
    # Errors of earlier attempts stay in the history, not on a completed job.
    fields = {
        **(progress or {}),
        "result": result_value(result, "result"),
        "progress": 100,
        "error_message": "",
        "error_type": "",
        "traceback": "",
        "last_success_watermark": Col("claimed_watermark"),
    }
    who = actor or _worker_actor(job)
    if isinstance(job, Job) and job.key is None and then is not None:
        now = now or timezone.now()
        if handover.possible(job, "complete", who, then, now):
            moved = handover.move_and_claim(
                job, "complete", actor=who, token=token, fields=fields, reason=reason, now=now, then=then
            )
            job.last_success_watermark = job.claimed_watermark
            return moved
    if isinstance(job, Job) and job.key is None:
        # No key, no re-run rule: move's own transaction is enough (no savepoint).
        moved = move(job, "complete", actor=who, token=token, reason=reason, fields=fields, now=now)
        job.last_success_watermark = job.claimed_watermark
        return moved
    with transaction.atomic():
        moved = move(job, "complete", actor=who, token=token, reason=reason, fields=fields, now=now)
        seen = _rerun_if_dirty(_pk(job))
    if isinstance(job, Job):
        job.last_success_watermark = seen
    return moved


def _rerun_if_dirty(pk: Any) -> int | None:
    """Queue the follow-up of a keyed job whose input watermark moved past the one
    its run was claimed at; return that claimed watermark.

    Never undoes the completion: the stored parameters are not validated again
    (they were when first enqueued; the schema may have changed since), and a kind
    that is no longer registered gets no re-run, only a warning.
    """
    current, seen, kind, key, parameters, owner_id, priority = (
        Job.objects.filter(pk=pk)
        .values_list(
            "input_watermark", "claimed_watermark", "kind", "key", "parameters", "owner_id", "priority"
        )
        .get()
    )
    if key is None or current is None or (seen is not None and current <= seen):
        return seen
    spec = registry.all_handlers().get(kind)
    if spec is None:
        logger.warning(
            "Job %s completed on watermark %s but its input is at %s; no handler is registered "
            "for '%s' any more, so no re-run was queued for key %r",
            pk,
            seen,
            current,
            kind,
            key,
        )
        return seen
    try:
        with transaction.atomic():
            _create(
                spec,
                parameters,
                owner=owner_id,
                key=key,
                watermark=current,
                priority=priority,
                run_after=None,
                max_attempts=None,
                parent=None,
                retry_of=None,
                actor=Actor.system("watermark"),
                reason="input changed while running",
            )
    except IntegrityError:
        # Cannot happen while this job held the key's only active slot; if it
        # does, keep the completion and leave the re-run to the next enqueue.
        logger.exception("Could not queue the re-run of job %s (key %r)", pk, key)
    return seen


def mark_partial(
    job: JobRef,
    token: UUID | str,
    result: Any = None,
    error: str = "",
    *,
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Job | None:
    """End the job ``partial``: some result, and an error saying what is missing.
    ``progress``, ``now`` and a ``token`` of None as in ``complete``."""
    now = checked_now(now)
    token = held(_pk(job), token, "mark_partial")
    fields = {
        **(progress or {}),
        "result": result_value(result, "result"),
        "progress": 100,
        "error_message": text(error or ""),
    }
    return move(
        job,
        "mark_partial",
        actor=actor or _worker_actor(job),
        token=token,
        reason=text(error or ""),
        fields=fields,
        now=now,
    )


def fail(
    job: JobRef,
    token: UUID | str | None,
    error: str,
    *,
    error_type: str = "",
    traceback: str = "",
    retry: bool = True,
    retry_delay: float | None = None,
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
    now: datetime | None = None,
    unstarted: bool = False,
) -> Job | None:
    """Fail the current attempt: requeue with backoff while attempts remain
    (and ``retry``), else end the job ``failed`` with the error. ``progress``:
    progress fields not yet written, stored with the outcome. ``unstarted``: the
    handler of a processing job never started (``begin`` failed, or the call's
    set-up after it): no attempt is charged (``begin``'s is refunded), unless the
    job had ``JOBSTATE["SETUP_FAILURES_REFUNDED"]`` such failures in a row before
    this one: then the attempt is charged (``begin``'s kept, or one charged now),
    so one that recurs every time ends ``failed`` at ``max_attempts``
    (``setup_failures``; the history row says how many in a row).
    A processing job's attempt that ends charging nothing (refunded, or never
    begun) is marked ``unstarted`` in its history row's metadata, as ``move``
    marks every end of a claim never begun (an operator's fail, a cancel).

    A processing job whose cancel was requested (read under its row lock) ends
    ``cancelled`` instead, whatever ``retry`` and the attempts left say: a retry
    would only be cancelled later, and the last attempt must not end ``failed``.
    The reason names the error; ``progress`` is stored; the attempt stays
    counted (``unstarted`` refunds only a requeued or failed attempt).

    ``token``: the lease token of the attempt that failed, or None to fail the job
    without a lease (an operator, a script): no lease is checked, and a queued job
    can be failed too. A worker calls ``fail_held``, which refuses None.
    ``now`` as in ``complete``; ``retry_delay`` (None: the kind's backoff) is a
    number of seconds, else ``TypeError``."""
    now = checked_now(now) or timezone.now()
    if retry_delay is not None and (
        isinstance(retry_delay, bool) or not isinstance(retry_delay, int | float)
    ):
        raise TypeError(f"retry_delay is a number of seconds or None, not {retry_delay!r:.100}")
    error = text((error or error_type or "failed").strip() or "failed")
    error_type, traceback = text(error_type), text(traceback)
    pk = _pk(job)
    with transaction.atomic(), parent_locked(job):  # before this job's row: the lock order of move()
        row = (
            Job.objects.select_for_update()
            .filter(pk=pk)
            .values_list(
                "status",
                "lease_token",
                "attempts",
                "max_attempts",
                "kind",
                "started_at",
                "cancel_requested_at",
            )
            .first()
        )
        if row is None:
            raise Job.DoesNotExist(f"Job {pk} does not exist")
        status, lease_token, attempts, max_attempts, kind, started_at, requested = row
        if token is not None and (str(lease_token) != str(token) or status != Status.PROCESSING):
            raise LeaseLost(pk)
        if status == Status.PROCESSING and requested is not None:
            named = f"{error_type}: {error}" if error_type else error
            return _cancel_instead(job, token, named, requested, actor, progress, now, started_at is not None)
        details = {
            "attempt": attempts,
            "error": error,
            "error_type": error_type,
            "traceback": _clipped_traceback(traceback, error_type),
        }
        fields = {
            **(progress or {}),
            "error_message": error,
            "error_type": error_type[:200],
            "traceback": traceback,
        }
        # Whether its claim charged an attempt (not refunded, or never begun): move()
        # marks the history row of one that did not.
        spent, named = started_at is not None, error
        if unstarted and status == Status.PROCESSING:
            count = setup_failures.in_a_row(pk) + 1
            details[setup_failures.KEY] = count
            spent = setup_failures.charged(count)
            if spent:
                named = f"not started {count} times in a row, so the attempt is charged: {error}"
                if started_at is None:  # begin failed: the attempt it never charged
                    attempts += 1
                    details["attempt"] = attempts
                    fields["attempts"] = attempts
            elif started_at is not None:  # the row is locked: a plain value
                attempts -= 1
                fields.update(attempts=attempts, started_at=None)
        begun = spent if status == Status.PROCESSING else None
        if retry and status == Status.PROCESSING and attempts < max_attempts:
            if retry_delay is None:
                spec = registry.all_handlers().get(kind)
                retry_delay = backoff_seconds(attempts, spec)
            run_after = now + timedelta(seconds=bounded(retry_delay))
            details["retry_at"] = run_after.isoformat()
            return move(
                job,
                "requeue",
                actor=actor or _worker_actor(job),
                token=token,
                reason=(
                    f"attempt {attempts} failed: {named}"
                    if spent
                    else f"not started (no attempt charged): {error}"
                )[:1000],
                fields={**fields, "run_after": run_after, "worker_id": ""},
                metadata=details,
                now=now,
                begun=begun,
            )
        if status not in (Status.QUEUED, Status.PROCESSING):
            raise InvalidTransition(status, Status.FAILED, "fail")
        return move(
            job,
            "fail",
            actor=actor or _worker_actor(job),
            token=token,
            reason=named[:1000],
            fields=fields,
            metadata=details,
            now=now,
            begun=begun,
        )


def fail_held(
    job: JobRef,
    token: UUID | str | None,
    error: str,
    *,
    error_type: str = "",
    traceback: str = "",
    retry: bool = True,
    retry_delay: float | None = None,
    actor: Actor | None = None,
    progress: dict[str, Any] | None = None,
    now: datetime | None = None,
    unstarted: bool = False,
) -> Job | None:
    """``fail`` as a worker calls it, for the attempt its lease token holds: a
    ``token`` of None is refused (``LeaseLost``), nothing written, where ``fail``
    would fail the job without a lease."""
    return fail(
        job,
        held(_pk(job), token, "fail"),
        error,
        error_type=error_type,
        traceback=traceback,
        retry=retry,
        retry_delay=retry_delay,
        actor=actor,
        progress=progress,
        now=now,
        unstarted=unstarted,
    )


def _cancel_instead(
    job: JobRef,
    token: UUID | str | None,
    error: str,
    requested: datetime,
    actor: Actor | None,
    progress: dict[str, Any] | None,
    now: datetime,
    begun: bool,
) -> Job | None:
    """``fail`` of a processing job whose cancel was requested: end it ``cancelled``
    (inside fail's transaction, the row locked), the error named in the reason."""
    return move(
        job,
        "cancel",
        actor=actor or _worker_actor(job),
        token=token,
        reason=f"cancel requested; the attempt ended with {error}"[:1000],
        fields=progress,
        metadata={"requested_at": requested.isoformat()},
        now=now,
        begun=begun,
    )


def _worker_actor(job: JobRef) -> Actor:
    worker = job.worker_id if isinstance(job, Job) else ""
    return Actor.worker(worker) if worker else Actor("worker")


_TRACEBACK_KEPT = 8000


def _clipped_traceback(traceback: str, error_type: str) -> str:
    """The history's copy of a traceback: its last ``_TRACEBACK_KEPT`` characters, unless
    that cuts the start of its last ``module.Class: message`` line (a long message),
    which alone names the exception's module: then the frames before that line and
    the line's start."""
    if len(traceback) <= _TRACEBACK_KEPT:
        return traceback
    cut = len(traceback) - _TRACEBACK_KEPT
    header = rf"^(?:[A-Za-z_]\w*\.)*{re.escape(error_type)}(?::|$)"
    starts = [m.start() for m in re.finditer(header, traceback, re.MULTILINE)] if error_type else []
    if not starts or starts[-1] >= cut:
        return traceback[cut:]
    start, half = starts[-1], _TRACEBACK_KEPT // 2
    return traceback[max(0, start - half) : start] + traceback[start : start + half]
