"""Claims sized to demand: one claim per batch, none while a batch would be small."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django_q.conf import Conf

from jobstate import services
from jobstate.worker import cluster, counters, room
from jobstate.worker.broker import JobBroker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(counters, "pending", None)
    monkeypatch.setattr(counters, "busy", None)
    monkeypatch.setattr(counters, "plain", None)
    monkeypatch.setattr(cluster, "_cluster_id", None)
    monkeypatch.setattr(Conf, "POLL", 0.01)
    monkeypatch.setattr(Conf, "WORKERS", 2)
    monkeypatch.setattr(Conf, "QUEUE_LIMIT", 100)
    monkeypatch.setattr(room, "FULL_WAIT_MAX", 0.02)
    broker = JobBroker(list_key="jobstate-test-batches")
    calls: list[int] = []
    claim = broker._claim

    def counted(kinds, limit):  # type: ignore[no-untyped-def]
        calls.append(limit)
        return claim(kinds, limit)

    broker._claim = counted  # type: ignore[method-assign]
    broker.calls = calls  # type: ignore[attr-defined]
    yield broker
    broker.close()


@override_settings(JOBSTATE={"PREFETCH": 8})
def test_one_claim_takes_all_the_room(broker):
    services.enqueue_many([("test.echo", {"i": i}) for i in range(20)])
    assert len(broker.dequeue()) == 8
    assert broker.calls == [8]


@override_settings(JOBSTATE={"PREFETCH": 8})
def test_no_claim_while_the_batch_would_be_small(broker):
    services.enqueue_many([("test.echo", {"i": i}) for i in range(20)])
    assert len(broker.dequeue()) == 8
    for _ in range(3):  # three packages picked up: 5 still waiting, room for 3 < half
        counters.picked_up()
    assert broker.dequeue() is None
    assert broker.calls == [8]
    counters.picked_up()  # room for 4: half the prefetch, worth one claim
    assert len(broker.dequeue()) == 4
    assert broker.calls == [8, 4]
    for _ in range(6):  # only 2 waiting, as many as worker processes: claim now
        counters.picked_up()
    assert len(broker.dequeue()) == 6
    assert broker.calls == [8, 4, 6]
