"""Arguments of the service calls a worker makes: refused before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import Suspend
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
    services.heartbeat(claimed, claimed.lease_token, now=naive)
    services.complete(claimed, claimed.lease_token, now=naive)
    assert Job.objects.get(pk=claimed.pk).status == Status.COMPLETED
    assert services.requeue_expired(now=naive).total == 0


@pytest.mark.parametrize("worker", [5, None, b"w", ["w"]])
def test_a_worker_id_that_is_not_a_string_is_a_type_error_and_writes_nothing(worker):
    # claim(5) was taken on SQLite (claimed under worker_id "5") and failed oddly on
    # PostgreSQL; the other calls raised "'int' object is not subscriptable".
    queued, held, token = _held()
    before = stored()
    calls = [
        lambda: services.claim(worker),
        lambda: services.start(queued, worker),
        lambda: services.begin(held.pk, token, worker),
        lambda: services.extend_leases(worker, [(held.pk, token)]),
        lambda: services.extend_leases(worker, []),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"worker_id is a string, not "):
            call()
    if worker is not None:  # None: heartbeat keeps the holder's label
        with pytest.raises(TypeError, match=r"worker_id is a string, not "):
            services.heartbeat(held.pk, token, worker_id=worker)
    assert stored() == before


def test_enqueue_refuses_a_parent_or_retry_of_that_is_not_a_job_and_writes_nothing():
    # Django's "ValueError: Cannot assign "'abc'": "Job.parent" must be a "Job" instance."
    parent = services.enqueue("test.echo", {})
    before = stored()
    for name in ("parent", "retry_of"):
        for value in ("abc", parent.pk, str(parent.pk)):
            for enqueue in (services.enqueue, services.get_or_enqueue):
                with pytest.raises(TypeError, match=rf"^{name} is a Job or None, not "):
                    enqueue("test.echo", {}, **{name: value})
    assert stored() == before
    child = services.enqueue("test.echo", {}, parent=parent, retry_of=None)
    assert child.parent_id == parent.pk


@pytest.mark.parametrize("delay", ["3", True, [1]])
def test_fail_refuses_a_retry_delay_that_is_not_a_number_and_writes_nothing(delay):
    # "3" raised "'>' not supported between instances of 'str' and 'int'" from the backoff.
    _queued, held, token = _held()
    services.begin(held.pk, token, "w")
    before = stored()
    for fail in (services.fail, services.fail_held):
        with pytest.raises(TypeError, match=r"retry_delay is a number of seconds or None, not "):
            fail(held.pk, token, "boom", retry_delay=delay)
    assert stored() == before
    requeued = services.fail(held.pk, token, "boom", retry_delay=30)
    assert requeued is None or requeued.status == Status.QUEUED
    assert Job.objects.get(pk=held.pk).status == Status.QUEUED


@pytest.mark.parametrize(
    ("worker", "kinds", "message"),
    [
        ("w", "test.echo", r"^kinds is a list of kind names, not a string"),
        ("w", [5], r"^kinds is a list of kind names \(strings\), not of 5"),
        ("w", None, r"^kinds is a list of kind names, not None"),
        (5, ["test.echo"], r"^worker_id is a string, not 5"),
    ],
)
def test_a_next_claim_refuses_kinds_or_a_worker_id_claim_would_refuse(worker, kinds, message):
    # NextClaim("w", "test.echo") was taken: on PostgreSQL the outcome claimed nothing
    # though a test.echo job was ready, and said it had tried (the worker took it that
    # none was ready).
    with pytest.raises(TypeError, match=message):
        services.NextClaim(worker, kinds)
    then = services.NextClaim("w", ("test.echo",))
    assert then.kinds == ["test.echo"]


def test_enqueue_children_refuses_a_retry_of_or_parent_that_is_not_a_job_and_writes_nothing():
    # Django's "Cannot assign ...: "Job.retry_of" must be a "Job" instance", or
    # "'str' object has no attribute 'owner_id'".
    parent = services.enqueue("test.echo", {})
    before = stored()
    for value in ("abc", parent.pk, str(parent.pk)):
        with pytest.raises(TypeError, match=r"^retry_of is a Job or None, not "):
            services.Child("test.echo", {}, retry_of=value)
        with pytest.raises(TypeError, match=r"^parent is a Job, not "):
            services.enqueue_children(value, [services.Child("test.echo", {})], actor=services.Actor("t"))
    assert stored() == before
    (child,) = services.enqueue_children(
        parent, [services.Child("test.echo", {}, retry_of=parent)], actor=services.Actor("t")
    )
    assert (child.parent_id, child.retry_of_id) == (parent.pk, parent.pk)


@pytest.mark.parametrize(
    ("until", "message"),
    [
        (datetime.now() + timedelta(hours=1), "until is a timezone-aware datetime."),
        ("2030-01-01T00:00:00Z", "until is a datetime."),
        (
            datetime.max.replace(tzinfo=timezone.get_fixed_timezone(-60)),
            "until is between the years 1 and 9999 in UTC.",
        ),
    ],
)
def test_suspend_refuses_an_until_it_could_not_store_and_writes_nothing(until, message):
    # Django only warned at a naive one and stored it in the default time zone; a
    # string reached the ORM's own error, past the year 9999 the database's.
    _, held, token = _held()
    before = stored()
    with pytest.raises(ValidationError) as refused:
        services.suspend(held, token, until=until)
    assert refused.value.message_dict == {"until": [message]}
    assert stored() == before


def test_a_handlers_suspend_with_an_until_it_could_not_store_is_refused_where_it_is_raised():
    with pytest.raises(TypeError, match=r"Suspend\(until=\.\.\.\) is a datetime or None, not str"):
        Suspend("later", until="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        Suspend("later", until=datetime.now())
    assert Suspend("later", until=timezone.now()).until is not None
