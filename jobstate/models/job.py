"""The Job model and its state machine, declared once with django-fsm-2."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections, models
from django.db.models import Q
from django.utils import timezone
from django_fsm import FSMField, FSMModelMixin, transition

from jobstate.ids import new_id
from jobstate.states import ACTIVE, TERMINAL, Status

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler

# Who sees every job (the admin's rule, used by the API, webhooks and metrics too).
VIEW_ALL_PERMISSIONS = ("jobstate.view_job", "jobstate.change_job")


def may_view_all(user: Any) -> bool:
    """Active staff with ``jobstate.view_job`` (or ``change_job``), as in the admin."""
    if not (getattr(user, "is_staff", False) and getattr(user, "is_active", False)):
        return False
    return any(user.has_perm(perm) for perm in VIEW_ALL_PERMISSIONS)


class LeaseClock(models.Expression):
    """Now (plus ``seconds``), to write or compare lease times with: on PostgreSQL
    the database's clock (``STATEMENT_TIMESTAMP()``), the one clock every machine
    shares, so that neither a reaper nor a worker whose own clock is off moves a
    lease; elsewhere (SQLite: one machine) this process's clock, as a parameter.

    ``jobstate.services`` writes leases and heartbeats with it (``lease_expires_at
    = LeaseClock(LEASE_SECONDS)``); its hand-built statements inline ``sql()``."""

    # Both in every lease write's prepared statement: keep them one shape.
    NOW = "STATEMENT_TIMESTAMP()"
    LATER = "STATEMENT_TIMESTAMP() + %s * INTERVAL '1 second'"

    # One field for every instance, as Django's own Now has: a field built per
    # expression cost a lease write more CPU than the rest of its Python side.
    output_field = models.DateTimeField()

    def __init__(self, seconds: float = 0) -> None:
        super().__init__()
        self.seconds = float(seconds)

    def sql(self) -> tuple[str, list[float]]:
        """PostgreSQL's expression and its parameters."""
        return (self.LATER, [self.seconds]) if self.seconds else (self.NOW, [])

    def local(self) -> datetime:
        """The same moment by this process's clock."""
        return timezone.now() + timedelta(seconds=self.seconds)

    @staticmethod
    def read(using: str = "default") -> datetime:
        """Now by this clock, as a value (for a check in Python that must agree with
        a filter): one query on PostgreSQL."""
        connection = connections[using]
        if connection.vendor != "postgresql":
            return timezone.now()
        with connection.cursor() as cursor:
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            row = cursor.fetchone()
        now: datetime = row[0]
        return now

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        if connection.vendor == "postgresql":
            return self.sql()
        return compiler.compile(models.Value(self.local(), output_field=models.DateTimeField()))


class JobQuerySet(models.QuerySet["Job"]):
    def queued(self) -> JobQuerySet:
        return self.filter(status=Status.QUEUED)

    def waiting(self) -> JobQuerySet:
        """Jobs waiting for their children (never claimed until woken)."""
        return self.filter(status=Status.WAITING)

    def processing(self) -> JobQuerySet:
        return self.filter(status=Status.PROCESSING)

    def reserved(self) -> JobQuerySet:
        """Processing jobs a cluster claimed that no worker process has begun yet
        (waiting in its in-memory queue): no attempt charged, ``started_at`` NULL."""
        return self.filter(status=Status.PROCESSING, started_at__isnull=True)

    def running(self) -> JobQuerySet:
        """Processing jobs whose handler a worker process has begun."""
        return self.filter(status=Status.PROCESSING, started_at__isnull=False)

    def active(self) -> JobQuerySet:
        return self.filter(status__in=ACTIVE)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=TERMINAL)

    def ready(self, now: Any = None) -> JobQuerySet:
        """Queued jobs whose ``run_after`` has passed, in claim order."""
        return self.queued().filter(run_after__lte=now or timezone.now()).order_by(*CLAIM_ORDER)

    def expired(self, now: Any = None) -> JobQuerySet:
        """Processing jobs whose lease has run out (their worker is presumed dead):
        at ``now``, or by ``LeaseClock`` when None."""
        return self.processing().filter(lease_expires_at__lt=now or LeaseClock())


def with_retried(jobs: models.QuerySet[Job]) -> models.QuerySet[Job]:
    """``jobs``, each with ``retried``: whether a retry of it exists (a job is retried
    once, ``services.retry``), which ``was_retried`` reads without a query per job."""
    return jobs.annotate(retried=models.Exists(Job.objects.filter(retry_of=models.OuterRef("pk"))))


def latest_retry(job_id: Any) -> Any | None:
    """The id of the newest job whose ``retry_of`` is ``job_id``, or None."""
    return Job.objects.filter(retry_of=job_id).order_by("-created_at").values_list("pk", flat=True).first()


def was_retried(job: Job) -> bool:
    """Whether a retry of ``job`` exists: ``with_retried``'s annotation, else one query."""
    annotated = getattr(job, "retried", None)
    if annotated is not None:
        return bool(annotated)
    return Job.objects.filter(retry_of=job.pk).exists()


CLAIM_ORDER = ("-priority", "run_after", "created_at")
# Columns written while a job runs (progress, heartbeats, lease renewal, begin):
# no index covers them, nor any partial index's condition, so on PostgreSQL
# those updates are HOT (heap-only: no index entry written; tests/test_job_indexes.py).
# On PostgreSQL they also end the row, side by side (jobstate.models.layout: migration
# 0015 on a small table, ``manage.py jobstate_move_hot_columns`` on a large one), so
# such an update logs only the few bytes between the first and the last it changed.
HOT_COLUMNS = (
    "progress",
    "progress_message",
    "current_step",
    "heartbeat_at",
    "lease_expires_at",
    "updated_at",
    "started_at",
    "attempts",
    "worker_id",
)


def forget_owner(collector: Any, field: Any, sub_objs: Any, using: str) -> None:
    """``on_delete`` for ``Job.owner``: keep the jobs, drop the owner and the key.

    Idempotency keys are scoped per owner; an ownerless job would otherwise
    enter the system jobs' key space, collide with an active system job or
    answer a system enqueue with a deleted user's result.
    """
    # The key first: the collector runs its updates in order, and an ownerless
    # row that still had its key could hit the system jobs' unique index.
    collector.add_field_update(field.model._meta.get_field("key"), None, sub_objs)
    collector.add_field_update(field, None, sub_objs)


class Job(FSMModelMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    kind = models.CharField(max_length=200, help_text="Registered handler name.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=forget_owner,
        related_name="jobstate_jobs",
        # No index of its own: jobstate_job_owner_idx and jobstate_job_owner_new_idx
        # lead with owner_id and serve every lookup by owner (one index fewer per insert).
        db_index=False,
    )
    key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="Idempotency key, unique per kind and owner among active jobs.",
    )
    input_watermark = models.BigIntegerField(null=True, blank=True)
    claimed_watermark = models.BigIntegerField(
        null=True, blank=True, help_text="input_watermark when the current attempt was claimed."
    )
    last_success_watermark = models.BigIntegerField(null=True, blank=True)

    status = FSMField(max_length=20, choices=Status.choices, default=Status.QUEUED, protected=True)
    # Plain integer fields: the range checks below say everything a "positive"
    # field's own CHECK would. PostgreSQL parses every CHECK of a table on each
    # UPDATE of it, and every job updates its row four times or more.
    progress = models.SmallIntegerField(default=0)
    progress_message = models.CharField(max_length=500, blank=True, default="")
    current_step = models.CharField(max_length=200, blank=True, default="")

    parameters = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_message = models.TextField(blank=True, default="")
    error_type = models.CharField(max_length=200, blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    priority = models.SmallIntegerField(default=0)
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=3)
    run_after = models.DateTimeField(default=timezone.now)

    worker_id = models.CharField(max_length=200, blank=True, default="")
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="Graceful stop asked of a service-style job."
    )

    # No index of their own: a partial one each (``Meta.indexes``), holding only
    # the jobs that have one.
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries", db_index=False
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children", db_index=False
    )

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ("-created_at",)
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("retry_job", "Can retry jobs"),
            ("requeue_job", "Can requeue or fail stuck jobs"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=Status.values), name="jobstate_job_status_valid"),
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=100),
                name="jobstate_job_progress_range",
            ),
            models.CheckConstraint(
                condition=~Q(status=Status.FAILED) | ~Q(error_message=""),
                name="jobstate_job_failed_has_error",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=TERMINAL) | Q(finished_at__isnull=False),
                name="jobstate_job_terminal_has_finished_at",
            ),
            models.CheckConstraint(
                condition=~Q(status=Status.PROCESSING)
                | (Q(lease_token__isnull=False) & Q(lease_expires_at__isnull=False)),
                name="jobstate_job_processing_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1)
                & Q(attempts__gte=0)
                & Q(attempts__lte=models.F("max_attempts")),
                name="jobstate_job_attempts_bounded",
            ),
            # One active job per key, in each owner's own key space; system jobs
            # (no owner) share one. Two partial indexes: NULLs never collide in one.
            models.UniqueConstraint(
                fields=["kind", "owner", "key"],
                condition=Q(key__isnull=False) & Q(status__in=ACTIVE) & Q(owner__isnull=False),
                name="jobstate_job_one_active_per_owner_key",
            ),
            models.UniqueConstraint(
                fields=["kind", "key"],
                condition=Q(key__isnull=False) & Q(status__in=ACTIVE) & Q(owner__isnull=True),
                name="jobstate_job_one_active_system_key",
            ),
        ]
        indexes = [
            # The claim query: queued jobs by priority, then run_after.
            models.Index(
                fields=["-priority", "run_after", "created_at"],
                condition=Q(status=Status.QUEUED),
                name="jobstate_job_claim_idx",
            ),
            # The processing set (reserved and running jobs; small: bounded by the
            # workers and their prefetch): the reaper, stuck detection and the
            # per-kind concurrency count scan it. Keyed by ``kind``, which never
            # changes, and never by a column written while a job runs (see HOT_COLUMNS).
            models.Index(
                fields=["kind"],
                condition=Q(status=Status.PROCESSING),
                name="jobstate_job_processing_idx",
            ),
            # Every claim and every outcome writes a new row version and so an
            # entry into each index that holds the row: the indexes of columns most
            # jobs leave empty (owner, key, parent, retry_of, finished_at) hold only
            # the rows that have one (a lookup by value, ``= x`` or ``> x``, implies
            # it), so a system job pays for none of them.
            models.Index(
                fields=["owner", "status", "-created_at"],
                condition=Q(owner__isnull=False),
                name="jobstate_job_owner_idx",
            ),
            # An owner's jobs newest first (the API's default list and its keyset pages):
            # one range scan whatever the owner's share of the table or the page's depth.
            models.Index(
                fields=["owner", "-created_at", "-id"],
                condition=Q(owner__isnull=False),
                name="jobstate_job_owner_new_idx",
            ),
            # A status's jobs newest first. Completed jobs are most of any table, and
            # the created_at index lists them as fast filtered, so they stay out: the
            # outcome of most jobs writes no entry here. Processing jobs stay out too:
            # the processing index above holds that small set, so a claim writes no
            # entry here either.
            models.Index(
                fields=["status", "-created_at"],
                condition=~Q(status__in=[Status.COMPLETED, Status.PROCESSING]),
                name="jobstate_job_status_idx",
            ),
            models.Index(fields=["kind", "status"], name="jobstate_job_kind_idx"),
            models.Index(fields=["kind", "key"], condition=Q(key__isnull=False), name="jobstate_job_key_idx"),
            models.Index(
                fields=["status", "finished_at"],
                condition=Q(finished_at__isnull=False),
                name="jobstate_job_finished_idx",
            ),
            # A parent's children by status: the fan-in's "any still active?" after each
            # child's outcome, the cancel cascade and the admin's count by status read only
            # the entries of the statuses they name. No id after status: a parent's
            # entries of one status then share a key, which PostgreSQL stores once
            # (deduplication), a tenth of the index's size on a large fan-out.
            models.Index(
                fields=["parent", "status"],
                condition=Q(parent__isnull=False),
                name="jobstate_job_parent_status_idx",
            ),
            models.Index(
                fields=["retry_of"], condition=Q(retry_of__isnull=False), name="jobstate_job_retry_of_idx"
            ),
            models.Index(
                fields=["cancel_requested_at"],
                condition=Q(status=Status.PROCESSING, cancel_requested_at__isnull=False),
                name="jobstate_job_cancel_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} [{self.status}]"

    # The state machine. These methods only validate and move the in-memory
    # state; jobstate.services persists each move with a conditional UPDATE
    # and its JobEvent in one transaction. Never call them directly.

    @transition(field=status, source=Status.QUEUED, target=Status.PROCESSING)
    def claim(self) -> None:
        """A worker takes the job under a fresh lease."""

    @transition(field=status, source=Status.PROCESSING, target=Status.COMPLETED)
    def complete(self) -> None:
        """The handler returned a result."""

    @transition(field=status, source=Status.PROCESSING, target=Status.PARTIAL)
    def mark_partial(self) -> None:
        """The handler finished with a result and an error."""

    @transition(field=status, source=[Status.QUEUED, Status.WAITING, Status.PROCESSING], target=Status.FAILED)
    def fail(self) -> None:
        """Attempts exhausted, non-retryable error, unknown handler, worker lost or an operator."""

    @transition(
        field=status, source=[Status.QUEUED, Status.WAITING, Status.PROCESSING], target=Status.CANCELLED
    )
    def cancel(self) -> None:
        """A cancel request honoured (or its worker gone while cancelling)."""

    @transition(field=status, source=Status.PROCESSING, target=Status.QUEUED)
    def requeue(self) -> None:
        """Back to the queue: a retry with backoff, an expired lease, or a wait until a time."""

    @transition(field=status, source=Status.PROCESSING, target=Status.WAITING)
    def suspend(self) -> None:
        """The handler gives its worker back until its last active child ends."""

    @transition(field=status, source=Status.WAITING, target=Status.QUEUED)
    def wake(self) -> None:
        """Its last active child ended (or an operator): ready to run again."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration(self) -> Any:
        if self.started_at is None:
            return None
        return (self.finished_at or timezone.now()) - self.started_at
