"""``manage.py jobstate show``: what it reads of a job, and how it prints it (text or JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.template.defaultfilters import filesizeformat
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

from jobstate import services
from jobstate.models import Asset, Job, JobEvent
from jobstate.models.job import LeaseClock
from jobstate.states import ACTIVE, Status

HISTORY_ROWS = 50
ASSET_ROWS = 50


@dataclass
class Shown:
    """A job and its related rows, read once for the text and the JSON alike."""

    job: Job
    events: list[JobEvent]  # the latest HISTORY_ROWS, oldest first
    history_total: int
    retries: list[str]  # ids of the jobs that retried this one
    children: int
    assets: list[Asset]  # the first ASSET_ROWS of the job's results (services.result_assets)
    assets_total: int
    now: datetime  # by the clock leases and heartbeats are written with (LeaseClock)


def read(job: Job) -> Shown:
    events = list(job.events.select_related("actor").order_by("-id")[:HISTORY_ROWS])[::-1]
    assets = list(services.result_assets(job)[: ASSET_ROWS + 1])
    return Shown(
        job=job,
        events=events,
        history_total=job.events.count(),
        retries=[str(pk) for pk in job.retries.order_by("created_at").values_list("pk", flat=True)],
        children=job.children.order_by().count(),
        assets=assets[:ASSET_ROWS],
        assets_total=services.result_assets(job).count() if len(assets) > ASSET_ROWS else len(assets),
        now=_clock_now(),
    )


def _clock_now() -> datetime:
    """Now by ``LeaseClock``, naive as the job's times are with ``USE_TZ = False``."""
    now = LeaseClock.read()
    if not settings.USE_TZ and timezone.is_aware(now):
        now = timezone.make_naive(now)
    return now


def as_json(shown: Shown) -> str:
    return json.dumps(as_dict(shown), indent=2, cls=DjangoJSONEncoder)


def lines(shown: Shown) -> Iterator[str]:
    job = shown.job
    yield f"job        {job.pk}"
    yield f"kind       {job.kind}"
    status = Status(job.status).label if job.status in Status.values else job.status
    extra = " (cancel requested)" if job.cancel_requested_at and job.status != Status.CANCELLED else ""
    if job.stop_requested_at and job.status in ACTIVE:
        extra += " (stop requested)"
    yield f"status     {status}{extra}"
    yield f"owner      {job.owner.get_username() if job.owner else '-'}"
    progress = f"{job.progress}%" + (f"  {job.progress_message}" if job.progress_message else "")
    yield f"progress   {progress}" + (f"  [step {job.current_step}]" if job.current_step else "")
    yield f"attempts   {job.attempts} of {job.max_attempts}"
    yield f"priority   {job.priority}" + (f"   key {job.key}" if job.key else "")
    if marks := _watermarks(job):
        yield f"watermarks {marks}"
    yield f"created    {when(job.created_at)}"
    if job.run_after and job.run_after > job.created_at and job.status == Status.QUEUED:
        yield f"run after  {when(job.run_after)}"
    yield f"started    {when(job.started_at)}"
    yield f"finished   {when(job.finished_at)}"
    if job.cancel_requested_at:
        pending = ""
        if _cancel_pending(job):
            pending = f" ({_relative(job.cancel_requested_at, shown.now)}), not yet honoured by its worker"
        yield f"cancel     requested {when(job.cancel_requested_at)}{pending}"
    if job.stop_requested_at:
        yield f"stop       requested {when(job.stop_requested_at)}"
    if job.worker_id:
        yield f"worker     {job.worker_id}"
    if job.status == Status.PROCESSING and job.lease_expires_at:
        verb = "expires" if job.lease_expires_at > shown.now else "expired"
        yield f"lease      {verb} {when(job.lease_expires_at)} ({_relative(job.lease_expires_at, shown.now)})"
        beat = job.heartbeat_at
        yield f"heartbeat  {when(beat)} ({_relative(beat, shown.now)})" if beat else "heartbeat  - (none yet)"
    if job.parent_id:
        yield f"parent     {job.parent_id}"
    if job.retry_of_id:
        yield f"retry of   {job.retry_of_id}"
    for pk in shown.retries:
        yield f"retried as {pk}"
    if shown.children:
        yield f"children   {shown.children} job{'s' if shown.children != 1 else ''}"
    if job.error_message:
        yield f"error      {job.error_type + ': ' if job.error_type else ''}{job.error_message}"
    if job.result not in (None, {}, []):
        yield f"result     {json.dumps(job.result, cls=DjangoJSONEncoder)[:500]}"
    total = shown.history_total
    yield (
        f"history    ({total} transition{'s' if total != 1 else ''}"
        + (", latest shown)" if total > len(shown.events) else ")")
    )
    for e in shown.events:
        change = f"{e.from_status or '-'} -> {e.to_status}"
        reason = f"  {e.reason}" if e.reason else ""
        yield f"  {when(e.created_at)}  {change:<24} {e.transition:<17} {e.actor_text}{reason}"
    if shown.assets:  # none: no heading, as the admin's job page has no empty table
        total = shown.assets_total
        yield f"assets     ({total} asset{'s' if total != 1 else ''})"
        for a in shown.assets:
            # As the admin's job page: no size for an external URL, which has no stored file.
            size = str(filesizeformat(a.size)).replace("\xa0", " ") if a.file else "-"
            url = f"  {a.web_url}" if a.web_url and not a.file else ""
            yield f"  {when(a.created_at)}  {size:>9}  {a.content_type:<24} {a.asset_type:<16} {a.name}{url}"
        if total > len(shown.assets):
            yield f"  ... and {total - len(shown.assets)} more"
    if job.traceback:  # last, whole: the error line above says which error it is
        yield "traceback"
        for line in job.traceback.splitlines():
            yield f"  {line}"


def as_dict(shown: Shown) -> dict[str, Any]:
    """What the text shows: ``history`` holds the latest ``HISTORY_ROWS`` of
    ``history_total`` transitions; ``retried_as`` the jobs that retried this one,
    ``children`` how many child jobs it has; ``assets`` the first ``ASSET_ROWS`` of the
    ``assets_total`` files of its results, with the fields the API gives (no storage path)."""
    job = shown.job
    return {
        "id": job.pk,
        "kind": job.kind,
        "status": job.status,
        "owner": job.owner.get_username() if job.owner else None,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "current_step": job.current_step,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "key": job.key,
        "input_watermark": job.input_watermark,
        "claimed_watermark": job.claimed_watermark,
        "last_success_watermark": job.last_success_watermark,
        "created_at": job.created_at,
        "run_after": job.run_after,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "cancel_requested_at": job.cancel_requested_at,
        "stop_requested_at": job.stop_requested_at,
        "worker_id": job.worker_id,
        # The lease and heartbeat of a running job (null otherwise), and its cancel request
        # that its worker has not honoured yet.
        "lease_expires_at": job.lease_expires_at if job.status == Status.PROCESSING else None,
        "heartbeat_at": job.heartbeat_at if job.status == Status.PROCESSING else None,
        "cancel_pending": _cancel_pending(job),
        "parent": job.parent_id,
        "retry_of": job.retry_of_id,
        "retried_as": shown.retries,
        "children": shown.children,
        "error_type": job.error_type,
        "error_message": job.error_message,
        "traceback": job.traceback,
        "result": job.result,
        "history_total": shown.history_total,
        "history": [
            {
                "at": e.created_at,
                "from": e.from_status,
                "to": e.to_status,
                "transition": e.transition,
                "actor": e.actor_label,
                "actor_user": e.actor_user,
                "reason": e.reason,
            }
            for e in shown.events
        ],
        "assets_total": shown.assets_total,
        "assets": [
            {
                "id": a.pk,
                "asset_type": a.asset_type,
                "name": a.name,
                "content_type": a.content_type,
                "size": a.size,
                "sha256": a.sha256,
                "url": a.web_url or None,
                "metadata": a.metadata,
                "created_at": a.created_at,
            }
            for a in shown.assets
        ],
    }


def _cancel_pending(job: Job) -> bool:
    return job.status == Status.PROCESSING and job.cancel_requested_at is not None


def _relative(moment: datetime, now: datetime) -> str:
    """``in 4 minutes``, ``12 seconds ago``: ``moment`` from ``now``."""
    seconds = int((moment - now).total_seconds())
    if abs(seconds) < 60:
        return f"in {seconds}s" if seconds > 0 else f"{-seconds}s ago"
    text = f"in {timeuntil(moment, now)}" if seconds > 0 else f"{timesince(moment, now)} ago"
    return text.replace("\xa0", " ")  # Django's no-break spaces, as in sizes above


def _watermarks(job: Job) -> str:
    """``input 7  claimed 7  last success 6``: the watermarks that are set (0 is one)."""
    marks = (
        ("input", job.input_watermark),
        ("claimed", job.claimed_watermark),
        ("last success", job.last_success_watermark),
    )
    return "  ".join(f"{label} {value}" for label, value in marks if value is not None)


def when(moment: datetime | None) -> str:
    """In the current time zone; a naive time (``USE_TZ = False``) is so already."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return local.strftime("%Y-%m-%d %H:%M:%S")
