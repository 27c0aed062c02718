"""Retention keeps what an active retry still links to: the jobs earlier in its
retry chain."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobstate import services
from jobstate.models import Job
from jobstate.worker.runner import drain

pytestmark = pytest.mark.django_db(transaction=True)


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def age(*jobs: Job, days: float = 40) -> None:
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(finished_at=timezone.now() - timedelta(days=days))


def test_prune_keeps_every_job_earlier_in_the_retry_chain_of_an_active_job(temp_handler: Any) -> None:
    # A -> B (retry of A) -> C (retry of B, active): B was kept, but A went, and
    # B's retry_of was emptied under a chain still running.
    temp_handler("t.boom", lambda ctx: 1 / 0)
    first = services.enqueue("t.boom", {}, max_attempts=1)
    drain(kinds=["t.boom"])
    second = services.retry(first.pk)
    drain(kinds=["t.boom"])
    age(first, second)
    lone = services.enqueue("test.echo", {})
    drain(kinds=["test.echo"])
    age(lone)
    third = services.retry(second.pk)  # queued, not run here: active
    assert command("jobstate_prune", "--dry-run").startswith("would delete 1 job(s)")
    assert command("jobstate_prune", "--batch", "1").startswith("deleted 1 job(s)")
    assert not Job.objects.filter(pk=lone.pk).exists()
    assert Job.objects.get(pk=second.pk).retry_of_id == first.pk
    assert Job.objects.get(pk=third.pk).retry_of_id == second.pk
    temp_handler("t.boom")
    drain(kinds=["t.boom"])  # the chain ends: its old jobs go at the next sweep
    assert command("jobstate_prune", "--dry-run").startswith("would delete 2 job(s)")
    assert command("jobstate_prune").startswith("deleted 2 job(s)")
    assert list(Job.objects.values_list("pk", flat=True)) == [third.pk]


def _retry_under_way(monkeypatch: pytest.MonkeyPatch, make: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Start ``make()`` (a retry) in another thread and return once it holds the
    retried job's row lock, before its new job commits; ``go.set()`` lets it end."""
    import threading

    from django.db import connection

    from jobstate.services import control

    locked, go = threading.Event(), threading.Event()
    real = control._lock_retried

    def lock_then_wait(job_id: Any) -> None:
        real(job_id)
        locked.set()
        go.wait(timeout=10)

    monkeypatch.setattr(control, "_lock_retried", lock_then_wait)
    made: dict[str, Any] = {}

    def run() -> None:
        try:
            made["job"] = make()
        except Exception as exc:  # pragma: no cover - reported by the asserts
            made["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert locked.wait(timeout=10)
    return thread, go, made


def _postgresql_only() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL")


def test_a_retry_under_way_further_down_the_chain_keeps_the_chain(
    temp_handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's lock covered a retry of the job itself only: one of a later job
    # in its chain, committed after the re-check, found its chain cut.
    _postgresql_only()
    temp_handler("t.boom", lambda ctx: 1 / 0)
    first = services.enqueue("t.boom", {}, max_attempts=1)
    drain(kinds=["t.boom"])
    second = services.retry(first.pk)
    drain(kinds=["t.boom"])
    third = services.retry(second.pk)
    drain(kinds=["t.boom"])
    age(first, second)  # the third finished today: kept
    thread, go, made = _retry_under_way(monkeypatch, lambda: services.retry(third.pk))
    try:
        assert command("jobstate_prune").startswith("deleted 0 job(s)")
    finally:
        go.set()
        thread.join(timeout=20)
    assert Job.objects.get(pk=made["job"].pk).retry_of_id == third.pk
    assert [Job.objects.get(pk=j.pk).retry_of_id for j in (second, third)] == [first.pk, second.pk]
