"""Live worker processes, as they report themselves."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class WorkerProcess(models.Model):
    """One process of a django-q2 cluster that runs jobstate jobs.

    Each process (the cluster's pusher and every worker process) upserts its row
    every few seconds, busy or idle, so operators can tell an idle cluster from
    a dead one. Rows are written by ``jobstate.services.workers`` only; a row
    not seen for ``WORKER_ALIVE_SECONDS`` is a dead process, and old ones are pruned.
    """

    class Role(models.TextChoices):
        PUSHER = "pusher", "Pusher (claims jobs)"
        WORKER = "worker", "Worker (runs jobs)"

    name = models.CharField(max_length=200, primary_key=True, help_text="host:cluster pid:process pid")
    cluster = models.CharField(max_length=200, db_index=True, help_text="host:cluster pid")
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices)
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The job this process runs now (None: idle). No foreign key: this row is
    # written on a hot path and must never wait on, or block, the job's row.
    job_id = models.UUIDField(null=True, blank=True)
    jobs_done = models.PositiveIntegerField(default=0)
    # Leases this process renewed: a worker's heartbeats of its running job, a
    # pusher's extensions of jobs waiting in its queue (a counter per process).
    leases_renewed = models.PositiveBigIntegerField(default=0)
    # How far the process's clock is ahead of the database's, in seconds (negative:
    # behind), as its last beat measured it (``jobstate.worker.clock``); NULL
    # until measured, and on SQLite.
    clock_offset = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ("cluster", "role", "name")
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return f"{self.role} {self.name}"
