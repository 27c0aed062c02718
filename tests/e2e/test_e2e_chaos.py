"""Chaos end to end: whole clusters and single worker processes SIGKILLed, one
frozen with SIGSTOP past its lease, while jobs and workflows run (SQLite and
PostgreSQL; about a minute at most).

Checked afterwards: nothing lost (every job ended, completed), nothing stuck
(no active job left), no two runs under one lease, no completed workflow step
run again, attempts never above max_attempts; and jobs a cluster had only
reserved (claimed, not begun) when it was killed lose no attempt.
"""

from __future__ import annotations

import signal
import time

import pytest

from jobstate import services
from jobstate.models import Job, JobStep
from jobstate.states import TERMINAL, Status
from tests.e2e.support import QCluster, wait_for, worker_pid
from tests.models import Effect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Leases of 2 s, a reaper every 0.5 s (tests/e2e/support.py FAST_JOBSTATE).
LEASE = 2.0


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def transitions(job: Job) -> list[str]:
    return list(job.events.order_by("id").values_list("transition", flat=True))


def running_worker(cluster: QCluster, kind: str | None = None, timeout: float = 20) -> int:
    """The pid of a worker process of ``cluster`` that has begun a job (of
    ``kind`` if one is running within ``timeout``, else of any kind)."""
    return running_worker_of((cluster,), kind, timeout)[1]


def running_worker_of(
    clusters: tuple[QCluster, ...], kind: str | None = None, timeout: float = 20
) -> tuple[QCluster, int]:
    """A cluster among ``clusters`` and the pid of its worker process that has begun
    a job (of ``kind`` if one is running within ``timeout``, else of any kind)."""

    def find() -> tuple[QCluster, int] | None:
        jobs = Job.objects.running()
        if kind:
            jobs = jobs.filter(kind=kind)
        for worker in jobs.values_list("worker_id", flat=True):
            pid = worker_pid(worker)
            for cluster in clusters:
                if f":{cluster.pid}:" in worker and pid in cluster.pids():
                    return cluster, pid
        return None

    if kind is not None:
        try:
            return wait_for(find, timeout, 0.02)
        except AssertionError:
            kind = None
    names = ", ".join(str(cluster.pid) for cluster in clusters)
    return wait_for(find, 20, 0.02, f"a job running in cluster {names}")


def test_sigkill_and_sigstop_chaos_loses_nothing_and_never_runs_twice(qcluster, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    first, second = qcluster(workers=2), qcluster(workers=2)
    jobs = [
        services.enqueue("e2e.chaos", {"dir": str(runs), "seconds": 0.3 + (i % 4) * 0.1}) for i in range(48)
    ]
    flows = [services.enqueue("wf.five", {"delay": 0.6}) for _ in range(3)]

    # 1. One worker process SIGKILLed mid-job.
    first.kill(running_worker(first), signal.SIGKILL)
    # 2. One frozen past its lease, then thawed: its writes must be refused.
    frozen = running_worker(second)
    second.kill(frozen, signal.SIGSTOP)
    time.sleep(LEASE * 1.75)
    second.kill(frozen, signal.SIGCONT)
    # 3. A whole cluster SIGKILLed (jobs running and jobs reserved in memory), replaced.
    running_worker(first)
    first.stop(graceful=False)
    third = qcluster(workers=2)
    # 4. More work arrives; a worker process of a workflow is SIGKILLed mid-step, in
    #    whichever live cluster runs one (which one takes it is a race).
    flows += [services.enqueue("wf.five", {"delay": 0.6}) for _ in range(2)]
    jobs += [services.enqueue("e2e.chaos", {"dir": str(runs), "seconds": 0.4}) for _ in range(16)]
    victim, pid = running_worker_of((second, third), "wf.five", timeout=5)
    victim.kill(pid, signal.SIGKILL)

    everything = [*jobs, *flows]
    wait_for(
        lambda: (
            not Job.objects.filter(pk__in=[j.pk for j in everything]).exclude(status__in=TERMINAL).exists()
        ),
        60,
        0.2,
        f"every job to end\n{third.log()[-2000:]}",
    )

    # 0 lost, 0 stuck.
    statuses = set(Job.objects.filter(pk__in=[j.pk for j in everything]).values_list("status", flat=True))
    assert statuses == {Status.COMPLETED}, list(
        Job.objects.exclude(status=Status.COMPLETED).values_list("kind", "status", "error_message")
    )
    assert not Job.objects.active().exists()
    # attempts <= max_attempts, and the chaos charged some.
    for attempts, max_attempts in Job.objects.values_list("attempts", "max_attempts"):
        assert 1 <= attempts <= max_attempts
    assert Job.objects.filter(attempts__gt=1).exists()
    # 0 double runs: one run per lease token.
    assert not list(runs.glob("double-*")), sorted(p.name for p in runs.glob("double-*"))
    per_job: dict[str, int] = {}
    for path in runs.glob("*.json"):
        job_id = path.name[:36]
        per_job[job_id] = per_job.get(job_id, 0) + 1
    for job in jobs:
        assert per_job[str(job.pk)] <= fresh(job).attempts
    # No completed workflow step ran again.
    for flow in flows:
        assert fresh(flow).result == {"sum": 5, "seen": ["s1", "s2", "s3", "s4"]}
        for step in JobStep.objects.filter(job_id=flow.pk, status="completed"):
            later = Effect.objects.filter(
                job_id=flow.pk, label=f"{step.name}:start", created_at__gt=step.finished_at
            )
            assert not later.exists(), (step.name, list(later.values_list("label", "attempt")))
            assert Effect.objects.filter(job_id=flow.pk, label=step.name).count() >= 1


def test_jobs_reserved_by_a_sigkilled_cluster_return_to_the_queue_unspent(qcluster):
    # One worker busy with a long job; the pusher reserves the jobs behind it.
    doomed = qcluster(workers=1, jobstate={"PREFETCH": 4}, q_cluster={"queue_limit": 4})
    long = services.enqueue("e2e.slow", {"first_seconds": 30, "seconds": 0.3, "tick": 0.1})
    wait_for(lambda: Job.objects.running().filter(pk=long.pk).exists(), 15, message="long job running")
    behind = [services.enqueue("e2e.once", {}) for _ in range(3)]  # max_attempts=1
    ids = [job.pk for job in behind]
    wait_for(lambda: Job.objects.reserved().filter(pk__in=ids).count() == 3, 15, message="jobs reserved")

    doomed.stop(graceful=False)  # SIGKILL the whole process group
    assert not doomed.pids()
    for job in behind:
        reserved = fresh(job)
        assert reserved.status == Status.PROCESSING and reserved.attempts == 0 and reserved.started_at is None

    rescuer = qcluster(workers=2)
    for job in [long, *behind]:
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 30, message=rescuer.log()[-3000:])
    for job in behind:
        done = fresh(job)
        # Its single attempt was not spent by the dead cluster: it ran, once.
        assert done.status == Status.COMPLETED and done.attempts == 1, (done.status, done.error_message)
        assert transitions(done) == ["enqueue", "claim", "requeue", "claim", "complete"]
        requeue = done.events.get(transition="requeue")
        assert requeue.actor_label == "system:reaper" and "reserved by a cluster" in requeue.reason
        assert worker_pid(done.result["worker"]) in rescuer.pids()
    done = fresh(long)
    assert done.status == Status.COMPLETED and done.attempts == 2  # it had begun: charged
