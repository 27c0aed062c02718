"""The ``jobstate.webhook`` handler: one delivery, one attempt at a time.

Each attempt signs the payload afresh (a new ``webhook-timestamp``) under the
same ``webhook-id``, posts it, and stores a ``WebhookDelivery`` row with the
status code, timing and the start of the response. A 2xx completes the job;
anything else raises, and the job is retried with backoff and jitter until
WEBHOOK_MAX_ATTEMPTS. A worker killed mid-delivery leaves the job's lease to
expire; the reaper requeues it and the next attempt sends the same webhook-id
again (at least once; receivers deduplicate by webhook-id).
"""

from __future__ import annotations

import json
import math
import random
import time
from types import SimpleNamespace
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from jobstate import conf, registry
from jobstate.exceptions import NonRetryable
from jobstate.storable import text
from jobstate.webhooks import answerable, cache, errors, signing, transport
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobstate.webhooks.outbox import KIND


class DeliveryFailed(Exception):
    """The receiver did not accept the delivery (retried)."""


# Why a delivery whose endpoint is gone (before or during the attempt) sent nothing more.
ENDPOINT_DELETED = "endpoint deleted"
# Why a delivery queued before its endpoint's owner was made inactive sends nothing.
OWNER_INACTIVE = "the endpoint's owner is inactive (is_active false)"


# How an endpoint disabled after failures resumes (ends its disabled_reason, which
# its owner reads; the error quoted before it is cut short so that this stays whole).
REENABLE = (
    "Deliveries resume once it is enabled again, which also resets the failure count: "
    'PATCH {"enabled": true} on the endpoint in the webhooks API, or tick "Enabled" on its '
    "admin page. Fix the receiver first."
)

# The reason of an endpoint that changed owner while disabled (or during the attempt
# that disabled it): the error its reason quoted came from a delivery about a job of
# the previous owner, whose record the new owner does not see (``visibility``).
OWNER_CHANGED = (
    "disabled after failed attempts in a row, before the endpoint changed owner; their errors "
    f"are in the previous owner's delivery records. {REENABLE}"
)


def reason_after_owner_change(reason: str) -> str:
    """The ``disabled_reason`` an endpoint keeps when its owner changes: none if it
    had none, else one that quotes no delivery (nor names who answered for it)."""
    if not reason:
        return ""
    return answerable.after_owner_change(reason) or OWNER_CHANGED


# What an attempt needs besides the request WEBHOOK_TIMEOUT bounds: the DNS lookup
# before it (the system resolver's own timeouts: up to 30 s with glibc's defaults
# and three name servers), reading the job and the endpoint, storing the attempt.
ATTEMPT_MARGIN_SECONDS = 55.0


def attempt_timeout() -> float:
    """The delivery kind's ``timeout`` (the attempt's time limit, which its hard
    limit follows): WEBHOOK_TIMEOUT plus ``ATTEMPT_MARGIN_SECONDS``, so that a slow
    receiver's request times out (a failed attempt, retried) before the worker
    stops the attempt. Read once, as the kind is registered; a value the settings
    check refuses counts as the default here (``check`` reports it, not ``ready``)."""
    request = conf.get("WEBHOOK_TIMEOUT") if conf.well_typed("WEBHOOK_TIMEOUT") else None
    if request is None or not (math.isfinite(request) and request > 0):
        request = conf.DEFAULTS["WEBHOOK_TIMEOUT"]
    return float(request) + ATTEMPT_MARGIN_SECONDS


def backoff(attempt: int) -> float:
    base = float(conf.get("WEBHOOK_BACKOFF_BASE"))
    # A float power with a bounded exponent, as jobstate.retry's: past attempt 1024 the
    # int power overflowed the float product before the cap applied.
    delay: float = min(base * 2.0 ** min(max(attempt - 1, 0), 64), float(conf.get("WEBHOOK_BACKOFF_MAX")))
    return delay + random.uniform(0, delay * 0.25)


# How a job looks in a payload: the REST API's detail view as the endpoint's owner
# sees it. The API sits above this layer, so ``JobstateConfig.ready()`` hands its
# serializer down (``install(serializer=...)``) instead of this module importing it.
_serializer: Any = None


def payload(endpoint: WebhookEndpoint, job: Any, event: str, at: str) -> bytes:
    """``{"type", "timestamp", "data"}``: ``data`` is the job as the REST API's
    detail view shows it to the endpoint's owner."""
    if _serializer is None:
        raise RuntimeError("jobstate.webhooks is not installed (JobstateConfig.ready() installs it)")
    request = SimpleNamespace(user=endpoint.owner or AnonymousUser())
    data = _serializer(job, context={"request": request}).data
    body = {"type": event, "timestamp": at, "data": data}
    return json.dumps(body, cls=DjangoJSONEncoder, separators=(",", ":")).encode()


def _disabled(reason: str) -> str:
    """A skipped delivery's result for a disabled endpoint: ``endpoint disabled: why``
    (the reason's own "disabled: " left out); one disabled by hand (the admin's
    checkbox) has no reason, and no dangling colon."""
    why = reason.strip().removeprefix(answerable.PREFIX).strip()
    return f"endpoint disabled: {why}" if why else "endpoint disabled"


def deliver(ctx: Any) -> dict[str, Any]:
    """Deliver a webhook event (internal)."""
    from jobstate.models import Job

    params = ctx.job.parameters
    if ctx.job.owner_id is not None:
        # Only the outbox queues deliveries (as system jobs); refuse one a user queued.
        raise NonRetryable("webhook deliveries are queued by jobstate only")
    endpoints = WebhookEndpoint.objects.select_related("owner", "answerable")
    endpoint = endpoints.filter(pk=params["endpoint"]).first()
    if endpoint is None:
        return {"skipped": ENDPOINT_DELETED}
    if not endpoint.enabled:
        return {"skipped": _disabled(endpoint.disabled_reason)}
    if endpoint.owner is not None and not getattr(endpoint.owner, "is_active", True):
        return {"skipped": OWNER_INACTIVE}
    if answerable.lapsed(endpoint):
        return {"skipped": _disabled(answerable.stop(endpoint))}
    job = Job.objects.select_related("owner").prefetch_related("steps").filter(pk=params["job"]).first()
    if job is None:
        return {"skipped": "job deleted"}
    if endpoint.owner_id is not None and job.owner_id != endpoint.owner_id:
        raise NonRetryable("the endpoint's owner does not own this job")
    body = payload(endpoint, job, params["event"], params["at"])
    webhook_id = params["webhook_id"]
    record = WebhookDelivery(
        endpoint=endpoint,
        webhook_id=webhook_id,
        event=params["event"],
        job_id=job.pk,
        delivery_job_id=ctx.job.pk,
        attempt=ctx.job.attempts,
    )
    started = time.monotonic()
    try:
        headers = signing.headers(endpoint.signing_secrets(), webhook_id, int(time.time()), body)
        response = transport.post(endpoint.url, body, headers)
    except Exception as exc:
        # Stored where the endpoint's owner reads it: no addresses or server details.
        error = errors.public(exc)
        if not _failed(record, endpoint, error, started):
            return {"skipped": ENDPOINT_DELETED}
        if isinstance(exc, transport.Blocked):
            raise NonRetryable(error) from exc
        raise DeliveryFailed(error) from exc
    record.status_code = response.status
    # As text PostgreSQL stores: a NUL in a 2xx answer failed the save, and the
    # delivered message was sent again up to every attempt.
    record.response_body = text(response.body[:1024].decode("utf-8", "replace"))
    if 200 <= response.status < 300:
        record.ok = True
        _save(record, started)  # delivered, even if its endpoint (and its records) went meanwhile
        WebhookEndpoint.objects.filter(pk=endpoint.pk).exclude(consecutive_failures=0).update(
            consecutive_failures=0
        )
        return {"webhook_id": webhook_id, "status_code": response.status, "attempt": record.attempt}
    if not _failed(record, endpoint, f"HTTP {response.status}", started):
        return {"skipped": ENDPOINT_DELETED}
    raise DeliveryFailed(f"the receiver answered HTTP {response.status}")


def _save(record: WebhookDelivery, started: float) -> bool:
    """Store the attempt; False when its endpoint was deleted during it (the row's
    foreign key fails then: that made a delivered message a failed attempt, retried)."""
    record.duration_ms = int((time.monotonic() - started) * 1000)
    try:
        with transaction.atomic():  # the deferred foreign key is checked at its end
            record.save()
    except IntegrityError:
        if WebhookEndpoint.objects.filter(pk=record.endpoint_id).exists():
            raise
        return False
    return True


def _failed(record: WebhookDelivery, endpoint: WebhookEndpoint, error: str, started: float) -> bool:
    """Store a failed attempt and count it; False when the endpoint is gone."""
    record.error = text(error)[:2000]
    if not _save(record, started):
        return False
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(consecutive_failures=F("consecutive_failures") + 1)
    limit = int(conf.get("WEBHOOK_DISABLE_AFTER"))
    reason = text(f"disabled after {limit} failed attempts in a row; the last: {error[:1000]}. {REENABLE}")
    # Judged in the update: the endpoint may have changed owner during the attempt,
    # which was about a job of the owner read before it.
    quoted = Case(When(Q(owner=endpoint.owner_id), then=Value(reason)), default=Value(OWNER_CHANGED))
    disabling = WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True, consecutive_failures__gte=limit)
    if disabling.update(enabled=False, disabled_at=timezone.now(), disabled_reason=quoted):
        # A queryset update, without the model's save: drop the cached wanted events
        # as it does (at once, and at the commit when in a transaction).
        cache.changed(disabling.db)
    return True


def install(serializer: Any) -> None:
    """Register the delivery kind; ``serializer`` (a DRF serializer class) shapes payloads."""
    global _serializer
    _serializer = serializer
    registry.handler(
        KIND,
        max_attempts=int(conf.DEFAULTS["WEBHOOK_MAX_ATTEMPTS"]),
        timeout=attempt_timeout(),
        retry_backoff=backoff,
        api=False,
    )(deliver)
