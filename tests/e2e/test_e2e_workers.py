"""End to end: jobs run by real ``manage.py qcluster`` processes (SQLite and PostgreSQL).

Every test waits with deadlines and polling; the clusters run with short
leases (tests/e2e/support.py FAST_JOBSTATE).
"""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from jobstate import services
from jobstate.models import Job, JobEvent
from jobstate.states import TERMINAL, Status
from tests.e2e.support import wait_for, worker_pid

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def transitions(job: Job) -> list[str]:
    events = JobEvent.objects.filter(job=job).order_by("created_at", "id")
    return list(events.values_list("transition", flat=True))


def running_in_worker(job: Job) -> Job | None:
    """The job once a worker process (not just the pusher) holds it and reported progress."""
    current = fresh(job)
    if current.status == Status.PROCESSING and current.worker_id.count(":") == 2 and current.progress > 0:
        return current
    return None


def test_jobs_complete_with_progress_result_and_asset(qcluster, media_root):
    cluster = qcluster(workers=2)
    watched = services.enqueue("e2e.steps", {"steps": 4, "delay": 0.25, "asset": True})
    others = [services.enqueue("e2e.steps", {"steps": 2}) for _ in range(5)]

    seen = wait_for(lambda: running_in_worker(watched), 10, message="progress while running")
    assert 0 < seen.progress < 100 and seen.progress_message.startswith("step ")

    for job in [watched, *others]:
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 15, message=cluster.log()[-3000:])
    for job in [watched, *others]:
        done = fresh(job)
        assert done.status == Status.COMPLETED, (done.status, done.error_message)
        assert done.progress == 100 and done.attempts == 1 and done.finished_at is not None
        assert transitions(done) == ["enqueue", "claim", "complete"]
        claim, complete = JobEvent.objects.filter(job=done).exclude(transition="enqueue").order_by("id")
        # The cluster's pusher claims it for an idle worker process, or the worker
        # process that ran it claimed it itself as it ended its previous job (chain);
        # either way the history names who did.
        host, cluster_pid, pid = complete.actor_label.removeprefix("worker:").split(":")
        assert claim.actor_label in (f"worker:{host}:{cluster_pid}", complete.actor_label)
        assert int(cluster_pid) == cluster.pid
        assert done.result["pid"] == int(pid) and int(pid) in cluster.pids()
    done = fresh(watched)
    assert done.result["steps"] == 4
    asset = done.assets.get()
    stored = Path(media_root) / asset.file.name
    assert stored.read_text().startswith("step,done\n") and asset.size == stored.stat().st_size


def test_worker_sigkilled_mid_job_is_rescued_and_completed_by_another(qcluster):
    cluster = qcluster(workers=2)
    job = services.enqueue("e2e.slow", {"first_seconds": 30, "seconds": 0.5, "tick": 0.1})
    running = wait_for(lambda: running_in_worker(job), 10, message="job running in a worker")
    victim = worker_pid(running.worker_id)
    cluster.kill(victim, signal.SIGKILL)

    wait_for(lambda: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    done = fresh(job)
    assert done.status == Status.COMPLETED and done.attempts == 2
    assert done.result["attempt"] == 2 and worker_pid(done.result["worker"]) != victim
    assert transitions(done) == ["enqueue", "claim", "requeue", "claim", "complete"]
    rescue = done.events.get(transition="requeue")
    assert rescue.actor_label == "system:reaper" and str(victim) in rescue.metadata["worker"]


def test_a_job_waiting_in_memory_behind_a_long_one_keeps_its_lease(qcluster):
    # One worker and a prefetch: the second job waits, claimed, in memory (by
    # default nothing is reserved for a busy worker; it claims its next job itself).
    cluster = qcluster(workers=1, jobstate={"PREFETCH": 2})
    long = services.enqueue("e2e.slow", {"seconds": 3.5, "tick": 0.2})  # > LEASE_SECONDS (2)
    wait_for(lambda: running_in_worker(long), 10)
    behind = services.enqueue("e2e.steps", {"steps": 1})
    wait_for(lambda: fresh(behind).status == Status.PROCESSING, 10)  # claimed while the long one runs

    for job in (long, behind):
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 15, message=cluster.log()[-3000:])
    assert fresh(long).status == fresh(behind).status == Status.COMPLETED
    assert fresh(behind).attempts == 1 and transitions(behind) == ["enqueue", "claim", "complete"]
    claimed = behind.events.get(transition="claim").created_at
    assert claimed < long.events.get(transition="complete").created_at
    # Both renewals were counted: the worker's heartbeats of the long job, the pusher's
    # extensions of the job waiting in memory (jobstate_lease_renewals_total).
    from jobstate.models import WorkerProcess

    mine = WorkerProcess.objects.filter(cluster__endswith=f":{cluster.pid}", leases_renewed__gt=0)
    wait_for(lambda: set(mine.values_list("role", flat=True)) == {"pusher", "worker"}, 10)


def test_prefetch_never_fills_django_q_queue_so_waiting_leases_are_kept(qcluster):
    # queue_limit 1 with PREFETCH 4: a pusher blocked on a full queue would stop
    # renewing, then reap its own waiting jobs ("worker lost": one attempt only).
    cluster = qcluster(workers=1, jobstate={"PREFETCH": 4}, q_cluster={"queue_limit": 1})
    long = services.enqueue("e2e.slow", {"seconds": 4, "tick": 0.2})  # > 2 leases (2 s each)
    wait_for(lambda: running_in_worker(long), 10)
    behind = [services.enqueue("e2e.once", {}) for _ in range(3)]

    for job in (long, *behind):
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    for job in behind:
        done = fresh(job)
        assert done.status == Status.COMPLETED, (done.status, done.error_message, cluster.log()[-3000:])
        assert done.attempts == 1 and transitions(done) == ["enqueue", "claim", "complete"]
    assert fresh(long).status == Status.COMPLETED


def test_failing_handler_is_retried_with_backoff_then_failed(qcluster):
    cluster = qcluster(workers=2)
    doomed = services.enqueue("e2e.flaky", {})
    recovers = services.enqueue("e2e.flaky", {"succeed_on": 2})

    for job in (doomed, recovers):
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    failed = fresh(doomed)
    assert failed.status == Status.FAILED and failed.attempts == 3
    assert failed.error_message == "flaky failure on attempt 3" and failed.error_type == "RuntimeError"
    assert "RuntimeError" in failed.traceback
    assert transitions(failed) == ["enqueue", "claim", "requeue", "claim", "requeue", "claim", "fail"]
    events = list(failed.events.order_by("created_at", "id"))
    requeues = [e for e in events if e.transition == "requeue"]
    assert [e.metadata["attempt"] for e in requeues] == [1, 2]
    assert all("RuntimeError" in e.metadata["traceback"] for e in requeues)
    delays = []
    for requeue in requeues:
        retry_at = datetime.fromisoformat(requeue.metadata["retry_at"])
        delays.append((retry_at - requeue.created_at).total_seconds())
        next_claim = next(e for e in events if e.transition == "claim" and e.created_at > requeue.created_at)
        assert next_claim.created_at >= retry_at  # never started before its backoff ended
    assert delays[0] >= 0.4 and delays[1] >= 2 * 0.4 - 0.01  # exponential: base 0.4, then 0.8

    recovered = fresh(recovers)
    assert recovered.status == Status.COMPLETED and recovered.result == {"attempt": 2}
    assert recovered.error_message == ""  # the failed attempt stays in the history only


def test_cancelling_a_running_job_ends_it_cancelled(qcluster):
    cluster = qcluster(workers=1)
    job = services.enqueue("e2e.slow", {"seconds": 30, "tick": 0.1})
    wait_for(lambda: running_in_worker(job), 10, message="job running")
    services.request_cancel(job, "api", "changed my mind")

    wait_for(lambda: fresh(job).status in TERMINAL, 10, message=cluster.log()[-3000:])
    done = fresh(job)
    assert done.status == Status.CANCELLED and done.attempts == 1
    assert transitions(done) == ["enqueue", "claim", "request_cancel", "cancel"]
    assert done.events.get(transition="cancel").actor_label.count(":") == 3  # worker:<host>:<pid>:<pid>


def test_a_handler_deaf_to_every_stop_is_killed_at_its_hard_limit_and_rescued(qcluster):
    # Hard limit: ceil(timeout 0.5 + cancel grace 0.3 + margin 0) = 1 s (+3 s django-q2 slack).
    cluster = qcluster(workers=1, jobstate={"CANCEL_GRACE_SECONDS": 0.3, "HARD_KILL_MARGIN_SECONDS": 0})
    job = services.enqueue("e2e.stuck", {})
    running = wait_for(lambda: fresh(job).worker_id.count(":") == 2 and fresh(job), 10)
    stuck_pid = worker_pid(running.worker_id)

    wait_for(lambda: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    done = fresh(job)
    assert done.status == Status.FAILED and done.error_type == "WorkerLost"
    assert done.events.get(transition="fail").actor_label == "system:reaper"
    assert stuck_pid not in cluster.pids()
    assert "reincarnated worker" in cluster.log() and "after timeout" in cluster.log()


def test_a_handler_deaf_to_its_timeout_is_given_up_and_a_stopping_cluster_exits(qcluster):
    # The handler swallows its timeout interrupt (at 2 s) and django-q2's hard limit
    # (at 5 s). The cluster is stopped (SIGTERM) while it runs: django-q2 then waits
    # for its worker processes without a limit, and its guard, which kills one past
    # its hard limit, no longer runs; the pusher (and its reaper) stops first. The
    # worker gives the handler up 1 s after its interrupt: Timeout recorded, the
    # process ended, and the stop finishes.
    cluster = qcluster(workers=1, jobstate={"INTERRUPT_GRACE_SECONDS": 1})
    job = services.enqueue("e2e.deaf", {})
    wait_for(lambda: fresh(job).worker_id.count(":") == 2, 10, message="job begun by a worker process")
    stopping = time.monotonic()
    cluster.stop(timeout=15)
    assert cluster.proc is not None and cluster.proc.returncode == 0, cluster.log()[-3000:]
    assert time.monotonic() - stopping < 12
    done = fresh(job)
    assert done.status == Status.FAILED and done.error_type == "Timeout", (done.status, done.error_type)
    assert done.events.get(transition="fail").actor_label.startswith("worker:")  # not the reaper
    assert "given up" in cluster.log() and "this worker process ends" in cluster.log()


def test_concurrency_limit_holds_across_worker_processes(qcluster, tmp_path):
    cluster = qcluster(workers=4)
    jobs = [services.enqueue("e2e.limited", {"dir": str(tmp_path), "seconds": 0.4}) for _ in range(8)]
    for job in jobs:
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    assert {fresh(job).status for job in jobs} == {Status.COMPLETED}

    runs = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(runs) == 8
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    running = peak = 0
    for _t, step in edges:
        running += step
        peak = max(peak, running)
    # Four idle workers, eight ready jobs: only the limit keeps it at two.
    assert peak == 2, runs
    assert len({r["pid"] for r in runs}) >= 2


def test_stale_worker_writes_are_refused(qcluster):
    cluster = qcluster(workers=2)
    job = services.enqueue("e2e.slow", {"first_seconds": 60, "seconds": 0.5, "tick": 0.1})
    running = wait_for(lambda: running_in_worker(job), 10, message="job running")
    stale = worker_pid(running.worker_id)
    cluster.kill(stale, signal.SIGSTOP)  # frozen: no heartbeat, so its lease runs out
    try:
        wait_for(lambda: fresh(job).status == Status.COMPLETED, 20, message=cluster.log()[-3000:])
        done = fresh(job)
    finally:
        cluster.kill(stale, signal.SIGCONT)
    assert done.attempts == 2 and worker_pid(done.result["worker"]) != stale

    # Thawed, the old worker carries on with its old token (its handler still has
    # a minute to run): its next heartbeat or progress is refused and it gives up.
    refusals = (
        f"Refused progress on job {job.pk}",
        f"Heartbeat of job {job.pk} refused: lease lost",
        f"Interrupting job {job.pk}: lease",
    )
    wait_for(lambda: any(r in cluster.log() for r in refusals), 10, message=cluster.log()[-3000:])
    wait_for(lambda: f"processing e2e.slow {job.pk}" in cluster.log() and _gave_up(cluster.log(), job), 10)
    after = fresh(job)
    assert after.status == Status.COMPLETED and after.result == done.result
    assert after.updated_at == done.updated_at and after.progress == 100
    assert after.worker_id == done.worker_id and after.heartbeat_at == done.heartbeat_at
    assert transitions(after) == ["enqueue", "claim", "requeue", "claim", "complete"]


def _gave_up(log: str, job: Job) -> bool:
    """django-q2 logs each finished package; the stale one is the second for this job."""
    return log.count(f"Processed 'jobstate.worker.tasks.execute' (e2e.slow {job.pk})") >= 2


def test_an_idle_cluster_shows_its_pusher_and_every_worker_process(qcluster):
    """Before any job: operators must tell an idle cluster from a dead one."""
    from jobstate.models import WorkerProcess
    from jobstate.services import workers as worker_processes

    cluster = qcluster(workers=2)
    prefix = f":{cluster.pid}"

    def recorded() -> list[WorkerProcess] | None:
        rows = [row for row in WorkerProcess.objects.all() if row.cluster.endswith(prefix)]
        roles = sorted(row.role for row in rows)
        return rows if roles == ["pusher", "worker", "worker"] else None

    rows = wait_for(recorded, 15, message=cluster.log()[-3000:])
    assert Job.objects.count() == 0
    workers = [row for row in rows if row.role == "worker"]
    assert {row.pid for row in workers} <= set(cluster.pids())
    assert all(row.job_id is None and row.jobs_done == 0 for row in workers)
    alive = [row.name for row in worker_processes.alive()]
    assert {row.name for row in rows} <= set(alive)


def test_assets_of_an_attempt_killed_by_sigkill_are_hidden_from_the_results(qcluster):
    from jobstate.models import Asset
    from jobstate.services import result_assets

    cluster = qcluster(workers=2)
    job = services.enqueue("e2e.asset_then_hang", {})
    running = wait_for(
        lambda: (
            (j := running_in_worker(job)) is not None and Asset.objects.filter(job_id=job.pk).exists() and j
        ),
        15,
        message="first attempt stored its asset",
    )
    cluster.kill(worker_pid(running.worker_id), signal.SIGKILL)

    wait_for(lambda: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    done = fresh(job)
    assert done.status == Status.COMPLETED and done.attempts == 2, (done.status, done.error_message)
    lost, kept = Asset.objects.filter(job_id=job.pk).order_by("attempt")
    assert (lost.attempt, lost.attempt_lost, lost.name) == (1, True, "attempt-1.csv")
    assert (kept.attempt, kept.attempt_lost, kept.name) == (2, False, "attempt-2.csv")
    assert [a.pk for a in result_assets(done)] == [kept.pk]
    assert lost.file.storage.exists(lost.file.name)  # kept for operators until pruned


def test_a_busy_worker_claims_its_next_jobs_itself(qcluster):
    """One worker process, ten short jobs: the pusher hands the idle worker one (or
    two, if it was quick); the worker then claims the others as it ends each job."""
    cluster = qcluster(workers=1)
    jobs = services.enqueue_many([("e2e.steps", {"steps": 1, "delay": 0.02})] * 10)
    for job in jobs:
        wait_for(lambda job=job: fresh(job).status in TERMINAL, 20, message=cluster.log()[-3000:])
    by_pusher = by_worker = 0
    for job in jobs:
        done = fresh(job)
        assert done.status == Status.COMPLETED and done.attempts == 1
        claim = done.events.get(transition="claim")
        complete = done.events.get(transition="complete")
        if claim.actor_label == complete.actor_label:  # claimed and run by one worker process
            by_worker += 1
            assert claim.metadata == {"attempt": 1}
        else:
            by_pusher += 1
            assert claim.actor_label == f"worker:{complete.actor_label.split(':')[1]}:{cluster.pid}"
    assert by_pusher <= 2 and by_worker >= 8, (by_pusher, by_worker)


def test_a_cluster_stopped_cleanly_leaves_no_worker_process_rows(qcluster):
    # SIGTERM: the pusher and each worker process remove their WorkerProcess rows as
    # they end, so that the admin's workers panel, the dashboard and
    # jobstate_workers_alive do not count a stopped cluster alive (its workers busy
    # with the jobs they last ran) for WORKER_ALIVE_SECONDS.
    from jobstate.models import WorkerProcess

    cluster = qcluster(workers=2)
    mine = WorkerProcess.objects.filter(cluster__endswith=f":{cluster.pid}")
    job = services.enqueue("e2e.slow", {"seconds": 1, "tick": 0.1})
    wait_for(lambda: running_in_worker(job), 10, message="job running in a worker")
    wait_for(lambda: set(mine.values_list("role", flat=True)) == {"pusher", "worker"}, 10)
    wait_for(lambda: mine.filter(job_id=job.pk).exists(), 10, message="the worker's row names its job")

    cluster.stop()
    assert cluster.proc is not None and cluster.proc.returncode == 0, cluster.log()[-3000:]
    assert fresh(job).status == Status.COMPLETED  # it finished its job first
    assert not mine.exists(), list(mine.values_list("name", "role", "job_id"))
