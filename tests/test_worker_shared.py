"""The cluster's shared counters survive a process killed while it updates them."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest

from jobstate import services
from jobstate.worker import counters, shared

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="the counters are shared through fork"
)


def _take_and_die(guard: Any) -> None:
    guard._lock.acquire()
    guard._holder.value = os.getpid()
    os.kill(os.getpid(), signal.SIGKILL)


def _take_unrecorded_and_die(guard: Any) -> None:
    guard._lock.acquire()  # killed before it could record itself as the holder
    os.kill(os.getpid(), signal.SIGKILL)


def _killed_holding(guard: Any, target: Any) -> None:
    child = multiprocessing.get_context("fork").Process(target=target, args=(guard,))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("target", [_take_and_die, _take_unrecorded_and_die])
def test_a_counter_outlives_a_process_killed_while_writing_it(target: Any) -> None:
    counter = shared.Counter()
    counter.add(3)
    _killed_holding(counter._guard, target)
    assert counter.get() == 3  # a read takes no lock
    done = threading.Event()

    def write() -> None:
        counter.add(-1)
        counter.lower_to(1)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(5 * shared.TAKEOVER_SECONDS + 2), "a write waits forever on a dead process's lock"
    assert counter.get() == 1


def _take_as_a_live_process_and_die(guard: Any) -> None:
    guard._lock.acquire()
    guard._holder.value = os.getppid()  # as if the dead holder's pid now named a live process
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_lock_held_for_too_long_is_taken_over_whoever_holds_it(monkeypatch: Any) -> None:
    monkeypatch.setattr(shared, "TAKEOVER_MAX_SECONDS", 1.0, raising=False)
    counter = shared.Counter()
    _killed_holding(counter._guard, _take_as_a_live_process_and_die)
    done = threading.Event()

    def write() -> None:
        counter.add(2)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(5), "a write waits forever on a lock whose holder's pid was reused"
    assert counter.get() == 2


def test_slots_outlive_a_process_killed_while_writing_them() -> None:
    slots = shared.Slots(4)
    slots.enter(os.getpid())
    _killed_holding(slots._guard, _take_and_die)
    assert slots.count() == 1
    done = threading.Event()

    def write() -> None:
        slots.leave(os.getpid())
        slots.forget_dead()
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(5 * shared.TAKEOVER_SECONDS + 2)
    assert slots.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_pusher_claims_after_a_worker_died_holding_the_counters(broker: Any) -> None:
    """Workers are disposable: a worker process killed at any instant, here inside
    ``counters.picked_up`` (the pending counter's lock held), must not stop the
    cluster's pusher from claiming (and, with it, reaping)."""
    services.enqueue("test.echo", {})
    assert counters.pending is not None and counters.pending.shared
    _killed_holding(counters.pending._guard, _take_and_die)
    handed: list[Any] = []
    done = threading.Event()

    def pusher() -> None:
        handed.extend(broker.dequeue() or [])
        done.set()

    threading.Thread(target=pusher, daemon=True).start()
    assert done.wait(10), "the pusher's dequeue() is blocked on a lock a dead worker holds"
    assert len(handed) == 1
