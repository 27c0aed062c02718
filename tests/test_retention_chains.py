"""Retention keeps what an active retry still reads or links to: the jobs earlier
in its retry chain, and the children of those (a workflow retried with
``retry_from`` reads them)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

import jobstate
from jobstate import registry, services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker.runner import drain
from jobstate.workflows import retry_from

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


class _Count(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> None:
        for i in range(3):
            ctx.spawn("wf.child", {"i": i})

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> dict[str, Any]:
        return {"split": sorted(j.result["i"] for j in ctx.child_jobs("split"))}


@pytest.fixture
def counting() -> Any:
    jobstate.workflow("t.count")(_Count)
    yield "t.count"
    registry.unregister("t.count")


def test_prune_keeps_the_children_an_active_workflow_retry_reads(counting: str) -> None:
    # retry_from copies the finished steps, and the retry reads the old job's
    # children (their results, their assets): retention deleted them under it.
    first = services.enqueue(counting, {})
    drain()
    first.refresh_from_db()
    assert first.result == {"split": [0, 1, 2]}
    children = list(Job.objects.filter(parent=first))
    age(first, *children)
    again = retry_from(first, "merge")  # queued: active
    assert command("jobstate_prune", "--dry-run").startswith("would delete 0 job(s)")
    assert command("jobstate_prune").startswith("deleted 0 job(s)")
    assert Job.objects.filter(parent=first).count() == 3
    drain()
    again.refresh_from_db()
    assert again.status == Status.COMPLETED and again.result == {"split": [0, 1, 2]}
    # A retry of that retry reads them too (its copied step still names them).
    age(again)
    third = retry_from(again, "merge")
    assert command("jobstate_prune").startswith("deleted 0 job(s)")
    assert Job.objects.filter(parent=first).count() == 3
    drain()
    third.refresh_from_db()
    assert third.result == {"split": [0, 1, 2]}
    age(third)
    assert command("jobstate_prune", "--dry-run").startswith("would delete 6 job(s)")
    assert command("jobstate_prune").startswith("deleted 6 job(s)")
    assert not Job.objects.exists()


def _retry_under_way(monkeypatch: pytest.MonkeyPatch, make: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Start ``make()`` (a retry) in another thread and return once it holds the
    retried job's row lock, before its new job commits; ``go.set()`` lets it end."""
    import threading

    from django.db import connection

    from jobstate.services import retries

    locked, go = threading.Event(), threading.Event()
    real = retries._lock_retried

    def lock_then_wait(job_id: Any) -> None:
        real(job_id)
        locked.set()
        go.wait(timeout=10)

    monkeypatch.setattr(retries, "_lock_retried", lock_then_wait)
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


def test_a_workflow_retry_under_way_keeps_the_old_children(
    counting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child's lock did not cover a retry_from of its parent being made: the
    # children went, then the retry read none.
    _postgresql_only()
    first = services.enqueue(counting, {})
    drain()
    age(first, *Job.objects.filter(parent=first))
    thread, go, made = _retry_under_way(monkeypatch, lambda: retry_from(first, "merge"))
    try:
        assert command("jobstate_prune").startswith("deleted 0 job(s)")
    finally:
        go.set()
        thread.join(timeout=20)
    assert Job.objects.filter(parent=first).count() == 3
    drain()
    assert Job.objects.get(pk=made["job"].pk).result == {"split": [0, 1, 2]}


def test_prune_keeps_every_job_below_an_active_one(temp_handler: Any) -> None:
    # Only the parent's status was looked at: the grandchild of an active job went
    # (its parent had ended), which a retry of that parent (a child workflow that
    # failed) reuses.
    temp_handler("t.later")
    root = services.enqueue("t.later", {})  # not run here: active
    child = services.enqueue("test.echo", {}, parent=root)
    grandchild = services.enqueue("test.echo", {}, parent=child)
    below = services.enqueue("test.echo", {}, parent=grandchild)
    drain(kinds=["test.echo"])
    age(child, grandchild, below)
    assert command("jobstate_prune", "--dry-run").startswith("would delete 0 job(s)")
    assert command("jobstate_prune", "--batch", "1").startswith("deleted 0 job(s)")
    assert Job.objects.count() == 4
    drain(kinds=["t.later"])
    age(root)
    assert command("jobstate_prune", "--dry-run").startswith("would delete 4 job(s)")
    assert command("jobstate_prune").startswith("deleted 4 job(s)")
