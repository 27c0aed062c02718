"""End to end: workflows in real ``qcluster`` worker processes, SIGKILLed mid-step.

The workflow writes an ``Effect`` row for every step (and item) it runs, so the
counts below are what really happened across the crash. The worker hangs at the
crash point after touching a marker file; the test kills it with SIGKILL there.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from jobstate import services
from jobstate.models import Job, JobStep
from jobstate.states import TERMINAL, Status
from tests.e2e.support import wait_for, worker_pid
from tests.models import Effect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def kill_at_marker(cluster, job: Job, marker: Path) -> int:  # type: ignore[no-untyped-def]
    def reached() -> bool:
        return marker.exists() and marker.read_text().strip().isdigit()

    wait_for(reached, 20, message=f"worker to reach the crash point\n{cluster.log()[-3000:]}")
    victim = int(marker.read_text())
    assert worker_pid(fresh(job).worker_id) == victim
    cluster.kill(victim, signal.SIGKILL)
    return victim


def finished(cluster, job: Job) -> Job:  # type: ignore[no-untyped-def]
    wait_for(lambda: fresh(job).status in TERMINAL, 25, message=f"job to finish\n{cluster.log()[-3000:]}")
    return fresh(job)


def test_sigkill_in_step_3_of_5_resumes_there(qcluster, tmp_path):
    cluster = qcluster(workers=2)
    marker = tmp_path / "crash"
    job = services.enqueue("wf.five", {"crash_at": "s3", "mode": "hang", "marker": str(marker)})
    victim = kill_at_marker(cluster, job, marker)

    done = finished(cluster, job)
    assert done.status == Status.COMPLETED and done.attempts == 2
    assert done.result == {"sum": 5, "seen": ["s1", "s2", "s3", "s4"]}
    runs = Counter(Effect.objects.filter(job_id=job.pk).values_list("label", flat=True))
    assert runs == {
        "s1:start": 1,
        "s1": 1,
        "s2:start": 1,
        "s2": 1,
        "s3:start": 2,  # killed once, resumed once
        "s3": 1,
        "s4:start": 1,
        "s4": 1,
        "s5:start": 1,
        "s5": 1,
    }
    assert victim not in Effect.objects.filter(job_id=job.pk, label="s3").values_list("pid", flat=True)
    steps = {s.name: s for s in JobStep.objects.filter(job_id=job.pk)}
    assert [steps[n].attempts for n in ("s1", "s2", "s3", "s4", "s5")] == [1, 1, 2, 1, 1]
    rescue = done.events.get(transition="requeue")
    assert rescue.actor_label == "system:reaper"


@pytest.mark.parametrize("atomic", [False, True], ids=["iterate", "atomic-batches"])
def test_sigkill_in_a_batched_step_resumes_from_the_cursor(qcluster, tmp_path, atomic):
    cluster = qcluster(workers=2)
    marker = tmp_path / "crash"
    params = {"n": 60, "crash_item": 34, "crash_at": "load", "mode": "hang", "marker": str(marker)}
    job = services.enqueue("wf.batch", {**params, "atomic": atomic})
    kill_at_marker(cluster, job, marker)

    done = finished(cluster, job)
    assert done.status == Status.COMPLETED and done.result == {"loaded": 60}
    runs = Counter(Effect.objects.filter(job_id=job.pk, label="item").values_list("item", flat=True))
    assert sorted(runs) == list(range(60))
    twice = sorted(i for i, n in runs.items() if n > 1)
    # The last checkpoint before the crash was after item 29: items 30..34 ran
    # again, unless each batch committed with its checkpoint (then none did).
    assert twice == ([] if atomic else [30, 31, 32, 33, 34])
    assert max(runs.values()) <= 2
    starts = list(Effect.objects.filter(job_id=job.pk, label="load:start").values_list("item", flat=True))
    assert starts == [None, 30]
    assert Effect.objects.filter(job_id=job.pk, label="prepare").count() == 1
    assert Effect.objects.filter(job_id=job.pk, label="report").count() == 1


def test_fan_out_of_50_children_across_worker_processes(qcluster):
    cluster = qcluster(workers=4)
    # Each child takes 20 ms: a worker that ends a job claims its next one itself, so
    # without work to share one worker can run 50 instant children before the pusher
    # has handed the idle ones anything (seen on SQLite); a second of work is shared.
    parent = services.enqueue("wf.fan", {"n": 50, "delay": 0.02})
    done = finished(cluster, parent)
    assert done.status == Status.COMPLETED and done.attempts == 1
    assert done.result == {"total": 50, "sum": sum(i * i for i in range(50)), "value": {"spawned": 50}}
    children = Job.objects.filter(parent=parent)
    assert children.count() == 50 and set(children.values_list("status", flat=True)) == {Status.COMPLETED}
    assert len({worker_pid(w) for w in children.values_list("worker_id", flat=True)}) > 1
    assert Effect.objects.filter(job_id=parent.pk, label="split").count() == 1
    assert Effect.objects.filter(job_id=parent.pk, label="merge").count() == 1


def test_sigkill_on_the_last_attempt_still_runs_the_undos_in_a_worker(qcluster, tmp_path):
    cluster = qcluster(workers=2)
    marker = tmp_path / "crash"
    params = {"crash_at": "ship", "mode": "hang", "marker": str(marker)}
    job = services.enqueue("wf.saga", params, max_attempts=1)
    victim = kill_at_marker(cluster, job, marker)

    done = finished(cluster, job)
    assert done.status == Status.FAILED and (done.attempts, done.max_attempts) == (1, 1)
    assert done.error_message == "step 'ship' failed: worker lost; undone: charge, book"
    undos = Effect.objects.filter(job_id=job.pk, label__startswith="undo:")
    assert list(undos.values_list("label", flat=True)) == ["undo:charge:C1", "undo:book:B1"]
    assert victim not in undos.values_list("pid", flat=True)
    runs = Counter(Effect.objects.filter(job_id=job.pk).values_list("label", flat=True))
    assert runs == {"book": 1, "charge": 1, "notify": 1, "undo:charge:C1": 1, "undo:book:B1": 1}
    rescue = done.events.get(transition="requeue")
    assert rescue.actor_label == "system:reaper" and rescue.metadata["recovery"] == "compensate"
