"""Queueing deliveries in the transaction of the transition they announce.

``on_transition`` runs on ``jobstate.hooks.transitioned`` inside the
transaction that records the change, and enqueues one ``jobstate.webhook`` job
per interested endpoint there: the deliveries commit with the change or not at
all (an outbox), and a worker delivers them, with retries, leases and rescue.

The common case, no endpoint wanting this event, costs no query: a process
keeps the set of event types any enabled endpoint wants for a second or two.

The endpoints of a user made inactive are left out (``listeners``): they hear
nothing until the user is active again.

A row whose ``events`` or ``kinds`` are not lists of strings (saved around the
API's and the admin's checks) is skipped and logged: it must not fail the
transition, whose transaction this is.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Q
from django.utils import timezone

from jobstate import conf, hooks
from jobstate.states import TERMINAL, Status
from jobstate.webhooks import cache, validation
from jobstate.webhooks.models import WebhookEndpoint

KIND = "jobstate.webhook"

logger = logging.getLogger("jobstate.webhooks")
_warned: set[tuple[int, str]] = set()  # the malformed endpoints logged (see _malformed)


def event_type(change: hooks.Transition) -> str | None:
    """The webhook event a transition is, if any."""
    if change.to_status in TERMINAL:
        return f"job.{change.to_status}"
    if change.transition == "claim":
        return "job.started"
    if change.transition in ("step_completed", "step_failed"):
        return "job.step"
    if change.to_status == Status.QUEUED and change.from_status in (Status.PROCESSING, Status.WAITING):
        # Back in the queue: a retry, the reaper's rescue, a wait until a time, or a
        # workflow woken from waiting for its children (``wake``).
        return "job.requeued"
    return None


def forget() -> None:
    """Drop what this process remembers: the wanted events, the endpoints warned about."""
    cache.forget()
    _warned.clear()


def wanted_events() -> frozenset[str]:
    """The event types some enabled endpoint subscribes to (cached per process)."""
    cached = cache.get()
    if cached is not None:
        return cached
    events: set[str] = set()
    rows = WebhookEndpoint.objects.filter(enabled=True)
    for endpoint_id, stored in rows.values_list("pk", "events"):
        wanted = validation.events_or_none(stored)
        if wanted is None:
            _malformed(endpoint_id, "events", stored)
        else:
            events.update(wanted)
    answer = frozenset(events)
    if not cache.uncommitted(rows.db):
        # Else read from this transaction's own changes, which a rollback undoes.
        cache.put(answer, float(conf.get("WEBHOOK_CACHE_SECONDS")))
    return answer


def on_transition(change: hooks.Transition) -> None:
    event = event_type(change)
    if event is None or event not in wanted_events():
        return
    from jobstate.models import Job

    row = Job.objects.filter(pk=change.job_id).values_list("kind", "owner_id").first()
    if row is None:
        return
    kind, owner_id = row
    if kind == KIND:
        return  # a delivery's own outcome is never announced (no recursion)
    endpoints = WebhookEndpoint.objects.filter(enabled=True).filter(listeners(owner_id))
    for endpoint_id, stored_events, stored_kinds in endpoints.values_list("pk", "events", "kinds"):
        events = validation.events_or_none(stored_events)
        kinds = validation.kinds_or_none(stored_kinds)
        if events is None:
            _malformed(endpoint_id, "events", stored_events)
        elif kinds is None:
            _malformed(endpoint_id, "kinds", stored_kinds)
        elif event in events and (not kinds or kind in kinds):
            queue_delivery(endpoint_id, change.job_id, event, change.at)


def listeners(owner_id: Any) -> Q:
    """The endpoints that hear of a job of ``owner_id``: the global ones, and the
    owner's own while the owner is active (a user made inactive hears nothing until
    made active again; the join is in the query the outbox makes anyway)."""
    if owner_id is None:
        return Q(owner__isnull=True)
    own = Q(owner_id=owner_id)
    if users_can_be_inactive():
        own &= Q(owner__is_active=True)
    return Q(owner__isnull=True) | own


def users_can_be_inactive() -> bool:
    """Whether the user model stores ``is_active`` (AbstractBaseUser's is a class
    attribute, always true, that a custom model may leave as it is)."""
    try:
        get_user_model()._meta.get_field("is_active")
    except FieldDoesNotExist:
        return False
    return True


def _malformed(endpoint_id: int, field: str, value: Any) -> None:
    # Once per endpoint and field in a process: it is asked on every transition.
    if (endpoint_id, field) in _warned or len(_warned) > 1000:
        return
    _warned.add((endpoint_id, field))
    logger.warning(
        "webhook endpoint %s skipped: its %s are not a list of strings (%.100r); fix it in the admin",
        endpoint_id,
        field,
        value,
    )


def queue_delivery(endpoint_id: int, job_id: Any, event: str, at: Any = None) -> Any:
    from jobstate import services

    return services.enqueue(
        KIND,
        {
            "endpoint": endpoint_id,
            "job": str(job_id),
            "event": event,
            "webhook_id": f"msg_{uuid.uuid4().hex}",
            "at": (at or timezone.now()).isoformat(),
        },
        max_attempts=int(conf.get("WEBHOOK_MAX_ATTEMPTS")),
        actor="system:webhooks",
    )


def writes(change: hooks.Transition) -> bool:
    """Whether ``on_transition`` may queue a delivery for this change, from the
    cached wanted events; when the cache is stale the answer is yes (the change
    then keeps its transaction, in which ``on_transition`` refreshes the cache)."""
    event = event_type(change)
    if event is None:
        return False
    wanted = cache.get()
    return wanted is None or event in wanted


def install() -> None:
    hooks.transitioned.register(on_transition, writes=writes)
