"""enqueue_many: bulk jobs with their history rows, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def test_each_job_gets_its_enqueue_event_with_actor_and_time(user):
    before = services.enqueue("test.echo", {})
    jobs = services.enqueue_many([("test.echo", {"i": i}) for i in range(1205)], owner=user)
    assert len(jobs) == Job.objects.count() - 1 == 1205
    events = JobEvent.objects.exclude(job=before)
    assert events.count() == 1205
    assert set(events.values_list("job_id", flat=True)) == {job.pk for job in jobs}
    columns = ("from_status", "to_status", "transition", "actor_id", "actor_label", "reason")
    rows = set(events.values_list(*columns))
    assert rows == {("", Status.QUEUED, "enqueue", user.pk, f"user:{user.username}", "")}
    event = events.first()
    assert event.metadata == {} and event.created_at == Job.objects.get(pk=event.job_id).created_at
    assert before.events.count() == 1


def test_system_actor_and_nothing_to_do():
    assert services.enqueue_many([]) == []
    (job,) = services.enqueue_many([("test.echo", None)])
    (event,) = job.events.all()
    assert (event.actor_id, event.actor_label) == (None, "system")


def test_rows_match_what_the_orm_would_have_written(user):
    (job,) = services.enqueue_many([("test.echo", {"a": [1, "b"], "n": None})], owner=user, priority=3)
    reference = Job(
        kind=job.kind,
        owner=user,
        parameters=job.parameters,
        priority=3,
        run_after=job.run_after,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        updated_at=job.updated_at,
    )
    Job.objects.bulk_create([reference])
    stored, expected = (Job.objects.filter(pk=pk).values().get() for pk in (job.pk, reference.pk))
    differ = {"id", "updated_at"}  # updated_at: auto_now, stamped by each insert
    assert {k: v for k, v in stored.items() if k not in differ} == {
        k: v for k, v in expected.items() if k not in differ
    }
    assert stored["status"] == Status.QUEUED and stored["parameters"] == {"a": [1, "b"], "n": None}
    job.refresh_from_db()  # the returned instances are saved ones
    assert job._state.adding is False


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_one_is_refused_before_anything_is_written(batch_size):
    # PostgreSQL wrote no job and returned them all as queued; SQLite raised
    # from inside the insert.
    with pytest.raises(ValueError, match="batch_size"):
        services.enqueue_many([("test.echo", {"i": i}) for i in range(3)], batch_size=batch_size)
    assert not Job.objects.exists()


def test_a_schema_less_kinds_parameters_are_stored_as_the_json_that_was_checked():
    # The check encodes as Django does (a datetime as ISO text, a Decimal, a UUID, a
    # tuple as a list); the insert used the column's plain encoder and raised TypeError
    # for what the check had let through. Now every path stores that JSON, read back.
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    token = UUID("12345678-1234-5678-1234-567812345678")
    given = {"when": when, "amount": Decimal("1.50"), "token": token, "pair": (1, 2)}
    stored = {"when": "2026-01-02T03:04:05Z", "amount": "1.50", "token": str(token), "pair": [1, 2]}
    one = services.enqueue("test.echo", given)
    many = services.enqueue_many([("test.echo", given), ("test.echo", given)])
    for job in [one, *many]:
        assert job.parameters == stored and job.parameters is not given
        assert Job.objects.get(pk=job.pk).parameters == stored
    given["when"] = "changed later"
    assert one.parameters == stored
