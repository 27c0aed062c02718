from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from jobstate.models import WorkerProcess
from jobstate.services import workers

pytestmark = pytest.mark.django_db


def test_first_beat_inserts_later_beats_update():
    t0 = timezone.now()
    workers.beat("h:10:11", cluster="h:10", role="worker", now=t0)
    job = uuid.uuid4()
    workers.beat(
        "h:10:11", cluster="h:10", role="worker", job_id=job, finished=2, now=t0 + timedelta(seconds=5)
    )
    row = WorkerProcess.objects.get()
    assert (row.host, row.pid, row.cluster, row.role) == ("h", 11, "h:10", "worker")
    assert row.job_id == job and row.jobs_done == 2 and row.started_at == t0
    assert row.seen_at == t0 + timedelta(seconds=5)


@override_settings(JOBSTATE={"WORKER_ALIVE_SECONDS": 30})
def test_alive_and_forget_dead():
    now = timezone.now()
    workers.beat("h:1:2", cluster="h:1", role="pusher", now=now)
    workers.beat("h:1:3", cluster="h:1", role="worker", now=now - timedelta(seconds=60))
    assert [w.name for w in workers.alive(now)] == ["h:1:2"]
    assert workers.forget_dead(older_than_seconds=45, now=now) == 1
    workers.gone("h:1:2")
    assert WorkerProcess.objects.count() == 0


def test_a_beat_returns_the_database_clock_on_postgresql_and_stores_the_offset_given():
    from django.db import connection

    assert workers.beat("h:1:2", cluster="h:1", role="worker") is None  # the first inserts
    before = timezone.now()
    database_now = workers.beat("h:1:2", cluster="h:1", role="worker", clock_offset=-1.5)
    if connection.vendor == "postgresql":
        assert database_now is not None and database_now.tzinfo is not None
    else:
        assert database_now is None
    workers.beat("h:1:2", cluster="h:1", role="worker", finished=1)  # no offset: kept
    row = WorkerProcess.objects.get()
    assert row.clock_offset == -1.5 and row.jobs_done == 1 and row.seen_at >= before


@pytest.mark.parametrize(
    ("now", "message"),
    [(datetime.now(), "now is a timezone-aware datetime."), ("now", "now is a datetime.")],
)
def test_a_naive_now_is_refused_with_use_tz_and_writes_nothing(now, message):
    # Django only warned and took it as if in the default time zone: a process seen
    # hours off in another zone, judged alive or dead by the wrong clock.
    aware = timezone.now()
    workers.beat("h:1:2", cluster="h:1", role="worker", now=aware)
    calls = [
        lambda: workers.beat("h:1:2", cluster="h:1", role="worker", now=now),
        lambda: workers.beat("h:1:3", cluster="h:1", role="worker", now=now),
        lambda: workers.alive(now),
        lambda: workers.forget_dead(0, now=now),
    ]
    for call in calls:
        with pytest.raises(ValidationError) as refused:
            call()
        assert refused.value.message_dict == {"now": [message]}
    assert list(WorkerProcess.objects.values_list("name", "seen_at")) == [("h:1:2", aware)]
