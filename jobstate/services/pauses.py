"""Pausing a kind: no worker claims its queued jobs until an operator resumes it.

The pause is a ``KindPause`` row; every claim leaves out the kinds with an active
one in its own statement (``claiming.ready_sql``), so a pause holds on every worker
and machine from its commit on. A job a cluster reserved before the pause is handed
back when a worker process would begin it (``lease.begin``'s UPDATE checks it too).
Queued jobs stay queued, enqueue still accepts new ones, and jobs already running
finish as usual.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from jobstate import registry
from jobstate.exceptions import KindPaused, PauseRefused, UnknownKind
from jobstate.models import Job, KindPause
from jobstate.services.actors import Actor
from jobstate.states import Status
from jobstate.storable import text

logger = logging.getLogger("jobstate")


def pause_kind(kind: str, actor: Actor | str | Any | None, reason: str = "") -> KindPause:
    """Pause ``kind``: from the commit on, no worker claims (or starts) its queued
    jobs until ``resume_kind``. Returns the new ``KindPause`` row.

    The kind is one registered here, or one with jobs in the table (a kind only the
    workers of another deploy register), else ``UnknownKind``: a misspelt name would
    pause nothing. A kind already paused is refused with ``PauseRefused`` (the same
    when another pause of it commits first: the database holds one active pause per
    kind); nothing is written then.
    """
    kind = _kind(kind)
    if not may_be_paused(kind):
        raise UnknownKind(kind)
    who = Actor.of(actor)
    with transaction.atomic():
        current = active_pause(kind)
        if current is not None:
            raise PauseRefused(kind, already_paused(current))
        try:
            with transaction.atomic():
                pause = KindPause.objects.create(
                    kind=kind,
                    paused_at=timezone.now(),
                    paused_by=who.user,
                    paused_by_label=text(who.label[:200]),
                    reason=text(reason),
                )
        except IntegrityError:  # another pause of it committed since the check
            current = active_pause(kind)
            raise PauseRefused(
                kind, already_paused(current) if current else f"'{kind}' was paused meanwhile"
            ) from None
    logger.info("jobstate: kind %s paused by %s: %s", kind, who.label, reason or "no reason given")
    return pause


def resume_kind(kind: str, actor: Actor | str | Any | None, reason: str = "") -> KindPause:
    """Resume a paused ``kind``: its queued jobs are claimed again from the commit on.
    Returns its ``KindPause`` row, now ended (kept as the record of the pause).

    A kind that is not paused (or that another resume ended first) is refused with
    ``PauseRefused``; nothing is written then. Any kind may be resumed, registered or not.
    """
    kind = _kind(kind)
    who = Actor.of(actor)
    now = timezone.now()
    with transaction.atomic():
        current = active_pause(kind)
        # Conditional: of two resumes at once, the second one updates nothing.
        ended = (
            KindPause.objects.active()
            .filter(pk=current.pk)
            .update(
                resumed_at=now,
                resumed_by=who.user,
                resumed_by_label=text(who.label[:200]),
                resume_reason=text(reason),
            )
            if current is not None
            else 0
        )
        if not ended:
            raise PauseRefused(kind, f"'{kind}' is not paused")
    logger.info("jobstate: kind %s resumed by %s: %s", kind, who.label, reason or "no reason given")
    return KindPause.objects.get(pk=current.pk)  # type: ignore[union-attr]


def may_be_paused(kind: str) -> bool:
    """Whether ``kind`` names a kind: registered here, or with jobs stored (one only
    the workers of another deploy register)."""
    return kind in registry.all_handlers() or Job.objects.filter(kind=kind).exists()


def paused_kinds() -> list[KindPause]:
    """The active pauses, one per paused kind, by kind."""
    active = KindPause.objects.active().select_related("paused_by")
    return list(active.order_by("kind"))


def active_pause(kind: str) -> KindPause | None:
    """``kind``'s active pause, or None when it is not paused."""
    return KindPause.objects.active().filter(kind=kind).select_related("paused_by").first()


def check_not_paused(kind: str) -> None:
    """``KindPaused`` if ``kind`` is paused (a job of it must not start now)."""
    if KindPause.objects.active().filter(kind=kind).exists():
        raise KindPaused(kind)


def queued_counts(kinds: list[str]) -> dict[str, int]:
    """How many jobs of each of ``kinds`` are queued (the (kind, status) index)."""
    rows = (
        Job.objects.filter(kind__in=kinds, status=Status.QUEUED)
        .order_by()
        .values("kind")
        .annotate(n=Count("pk"))
        .values_list("kind", "n")
    )
    return {kind: 0 for kind in kinds} | dict(rows)


def already_paused(pause: KindPause) -> str:
    return f"'{pause.kind}' is already paused ({describe(pause)})"


def describe(pause: KindPause) -> str:
    """ "by admin (alice) since 2026-11-30 16:10 UTC: the mail API is down"."""
    return f"by {pause.paused_by_text} since {_when(pause.paused_at)}" + (
        f": {pause.reason}" if pause.reason else ""
    )


def _when(moment: datetime) -> str:
    shown = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return shown.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _kind(kind: Any) -> str:
    if not isinstance(kind, str):
        raise TypeError(f"kind is a kind name (a string), not {kind!r}")
    return text(kind)
