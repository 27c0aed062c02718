"""Arguments of the service calls a worker makes: refused before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def stored() -> tuple[list[dict[str, Any]], int]:
    return list(Job.objects.order_by("pk").values()), JobEvent.objects.count()


def _held() -> tuple[Job, Job, Any]:
    """A queued job, and one claimed (not begun) under the returned token."""
    queued = services.enqueue("test.echo", {})
    held = services.enqueue("test.echo", {}, priority=1)
    (claimed,) = services.claim("w", limit=1)
    assert claimed.pk == held.pk
    return queued, claimed, claimed.lease_token


def _calls_with(now: Any, queued: Job, held: Job, token: Any) -> list[Callable[[], Any]]:
    return [
        lambda: services.claim("w", now=now),
        lambda: services.start(queued, "w", now=now),
        lambda: services.begin(held.pk, token, "w", now=now),
        lambda: services.heartbeat(held.pk, token, now=now),
        lambda: services.extend_leases("w", [(held.pk, token)], now=now),
        lambda: services.report_progress(held.pk, token, 50, now=now),
        lambda: services.complete(held.pk, token, {"ok": 1}, now=now),
        lambda: services.mark_partial(held.pk, token, {"ok": 0}, "half", now=now),
        lambda: services.fail(held.pk, token, "boom", now=now),
        lambda: services.fail(queued.pk, None, "boom", now=now),
        lambda: services.fail_held(held.pk, token, "boom", now=now),
        lambda: services.requeue_expired(now=now),
    ]


def test_a_naive_now_is_refused_with_use_tz_and_writes_nothing():
    # Django only warned ("received a naive datetime while time zone support is active")
    # and stored it as if in the default time zone: a lease hours off in another zone.
    queued, held, token = _held()
    naive = datetime.now() + timedelta(hours=1)
    before = stored()
    for call in _calls_with(naive, queued, held, token):
        with pytest.raises(ValidationError) as refused:
            call()
        assert refused.value.message_dict == {"now": ["now is a timezone-aware datetime."]}
    for call in _calls_with("2030-01-01T00:00:00Z", queued, held, token):
        with pytest.raises(ValidationError) as refused:
            call()
        assert refused.value.message_dict == {"now": ["now is a datetime."]}
    assert stored() == before
    aware = timezone.now()
    assert services.heartbeat(held.pk, token, now=aware).cancel_requested is False
    assert Job.objects.get(pk=held.pk).heartbeat_at == aware


def test_with_use_tz_false_a_naive_now_is_taken_as_before(settings):
    settings.USE_TZ = False
    services.enqueue("test.echo", {})
    naive = timezone.now()  # naive here, in TIME_ZONE as Django stores it
    (claimed,) = services.claim("w", now=naive, lease_seconds=60)
    assert claimed.lease_expires_at == naive + timedelta(seconds=60)
    services.complete(claimed, claimed.lease_token, now=naive)
    assert Job.objects.get(pk=claimed.pk).status == Status.COMPLETED
    assert services.requeue_expired(now=naive).total == 0
