"""Job ids: version 7 UUIDs, in creation order, and the short id the admin shows."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

import pytest

from jobstate import ids, services
from jobstate.ids import new_id, short
from jobstate.models import Asset, Job

pytestmark = pytest.mark.django_db


def test_new_ids_are_version_7_and_sorted_in_creation_order() -> None:
    made = [new_id() for _ in range(5000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in made)
    assert made == sorted(made) and len(set(made)) == len(made)
    # The first 48 bits are the creation time in milliseconds.
    assert abs((made[0].int >> 80) - time.time() * 1000) < 5000


def test_the_counter_overflowing_borrows_the_next_millisecond(monkeypatch: Any) -> None:
    monkeypatch.setattr(ids, "_last_ms", 0)  # as in a new process
    monkeypatch.setattr(ids, "_clock", lambda: 1_700_000_000_000 * 1_000_000)
    made = [new_id() for _ in range(5000)]  # more than 4096 in one millisecond
    assert made == sorted(made) and len(set(made)) == len(made)
    assert {i.int >> 80 for i in made} <= {1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002}


def test_a_clock_going_back_keeps_the_order(monkeypatch: Any) -> None:
    monkeypatch.setattr(ids, "_last_ms", 0)
    now = [1_800_000_000_000]
    monkeypatch.setattr(ids, "_clock", lambda: now[0] * 1_000_000)
    first = new_id()
    now[0] -= 60_000
    assert new_id() > first


def test_jobs_and_assets_get_version_7_ids() -> None:
    one = services.enqueue("test.echo", {})
    many = services.enqueue_many([("test.echo", {}) for _ in range(3)])
    assert one.pk.version == 7 and all(j.pk.version == 7 for j in many)
    assert [one.pk, *[j.pk for j in many]] == sorted([one.pk, *[j.pk for j in many]])
    stored = list(Job.objects.order_by("pk").values_list("pk", flat=True))
    assert stored == [one.pk, *[j.pk for j in many]]
    assert Asset._meta.pk.default is new_id  # type: ignore[union-attr]


def test_short_is_the_random_end(monkeypatch: Any) -> None:
    monkeypatch.setattr(ids, "_clock", lambda: 1_900_000_000_000 * 1_000_000)
    first, second = new_id(), new_id()
    assert short(first) == str(first)[-8:] and short(first) != short(second)
    assert str(first)[:8] == str(second)[:8]  # the time: what a prefix would have shown


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_another_thread_holds_the_lock_can_make_ids() -> None:
    with ids._lock:  # as if another thread were inside new_id() at the fork
        pid = os.fork()
        if pid == 0:  # the child: exits 0 if it could make an id
            signal.alarm(5)
            try:
                os._exit(0 if new_id().version == 7 else 1)
            finally:
                os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
