"""Hypothesis drives random sequences of service calls and checks the
invariants after every step."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jobstate import InvalidTransition, LeaseLost, services
from jobstate.exceptions import AlreadyRetried, CancelRequested, DuplicateActiveKey
from jobstate.models import Job, JobEvent
from jobstate.states import TERMINAL, Status

EXAMPLES = int(os.environ.get("JOBSTATE_HYPOTHESIS_EXAMPLES", "200"))
LEASE = 30


class JobLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Job.objects.all().delete()
        self.now = timezone.now()
        # job id -> the live token we were given, in claim order: draws must not
        # depend on random UUIDs, or Hypothesis cannot replay a failing example.
        self.tokens: dict[Any, Any] = {}
        self.stale: list[tuple[Any, Any]] = []  # (job id, token) no longer valid
        self.terminal: dict[Any, tuple[Any, ...]] = {}
        self.claimed_at: dict[Any, int | None] = {}  # job id -> input watermark when claimed
        self.owner = get_user_model().objects.get_or_create(username="hypothesis")[0]

    # -- helpers -------------------------------------------------------
    def _ids(self) -> list[Any]:
        return list(Job.objects.order_by("created_at", "pk").values_list("pk", flat=True))

    def _pick(self, data: st.DataObject, status: str | None = None) -> Any:
        qs = Job.objects.order_by("created_at", "pk")
        if status:
            qs = qs.filter(status=status)
        ids = list(qs.values_list("pk", flat=True))
        return data.draw(st.sampled_from(ids)) if ids else None

    def _drop_token(self, pk: Any) -> None:
        token = self.tokens.pop(pk, None)
        if token is not None:
            self.stale.append((pk, token))

    def _same_key(self, job: Job) -> Any:
        return Job.objects.filter(kind=job.kind, owner_id=job.owner_id, key=job.key)

    def _snapshot(self, pk: Any) -> tuple[Any, ...]:
        row = Job.objects.filter(pk=pk).values_list(
            "status", "progress", "result", "error_message", "finished_at", "lease_token"
        )
        return (row.get(), JobEvent.objects.filter(job_id=pk).count())

    # -- rules ---------------------------------------------------------
    @initialize(
        key=st.sampled_from(["a", "b"]),
        watermark=st.one_of(st.none(), st.integers(0, 5)),
        owned=st.booleans(),
    )
    def a_keyed_job_is_ready(self, key: str, watermark: int | None, owned: bool) -> None:
        """Start most runs where the watermark rule can matter: a keyed job, claimable now."""
        self.enqueue(key, watermark, 3, owned, ready=True)

    @rule(
        key=st.one_of(st.none(), st.sampled_from(["a", "b"])),
        watermark=st.one_of(st.none(), st.integers(0, 5)),
        max_attempts=st.integers(1, 3),
        owned=st.booleans(),
        ready=st.booleans(),
    )
    def enqueue(
        self, key: str | None, watermark: int | None, max_attempts: int, owned: bool, ready: bool
    ) -> None:
        before = set(self._ids())
        owner = self.owner if owned else None
        holder = Job.objects.filter(key=key, owner=owner, status__in=["queued", "processing"]).first()
        if key is not None and holder is not None and holder.cancel_requested_at is not None:
            # Its key's active job ends cancelled: refused, nothing written.
            with pytest.raises(DuplicateActiveKey):
                services.get_or_enqueue("test.echo", {}, key=key, watermark=watermark, owner=owner)
            assert set(self._ids()) == before
            assert Job.objects.get(pk=holder.pk).input_watermark == holder.input_watermark
            return
        job, created = services.get_or_enqueue(
            "test.echo",
            {"n": len(before)},
            key=key,
            watermark=watermark,
            max_attempts=max_attempts,
            owner=owner,
            # Claimable at once; otherwise only after time passes. On the state machine's
            # clock, not the real one (the default run_after): how much real time went by
            # made a replayed example draw from other jobs (FlakyStrategyDefinition).
            run_after=self.now if ready else self.now + timedelta(seconds=5),
        )
        assert created == (job.pk not in before)
        assert job.owner_id == (owner.pk if owner else None)
        if key is not None:
            active = Job.objects.filter(key=key, status__in=["queued", "processing"])
            assert active.filter(owner=None).count() <= 1
            assert active.filter(owner=self.owner).count() <= 1
            if not created and job.status in ["queued", "processing"] and watermark is not None:
                assert job.input_watermark is not None and job.input_watermark >= watermark

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), bump=st.integers(0, 2))
    def input_changes_while_running(self, data: st.DataObject, bump: int) -> None:
        self._input_changes(data.draw(st.sampled_from(list(self.tokens))), bump)

    def _input_changes(self, pk: Any, bump: int) -> None:
        """An enqueue with the running job's key: it raises that job's watermark
        (refused, nothing written, while a cancel request stands)."""
        running = Job.objects.get(pk=pk)
        if running.key is None:
            return
        watermark = (running.input_watermark or 0) + bump
        if running.cancel_requested_at is not None:
            with pytest.raises(DuplicateActiveKey):
                services.get_or_enqueue(
                    running.kind, {}, key=running.key, watermark=watermark, owner=running.owner
                )
            assert Job.objects.get(pk=pk).input_watermark == running.input_watermark
            return
        job, created = services.get_or_enqueue(
            running.kind, {}, key=running.key, watermark=watermark, owner=running.owner
        )
        assert not created and job.pk == pk
        assert Job.objects.get(pk=pk).input_watermark == watermark

    @rule(worker=st.sampled_from(["w1", "w2"]), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        ready = Job.objects.filter(status=Status.QUEUED, run_after__lte=self.now).count()
        jobs = services.claim(worker, limit=limit, lease_seconds=LEASE, now=self.now)
        assert len(jobs) == min(limit, ready)
        for job in jobs:
            assert job.pk not in self.tokens
            self.tokens[job.pk] = job.lease_token
            self.claimed_at[job.pk] = job.input_watermark
            assert job.claimed_watermark == job.input_watermark

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), percent=st.integers(-5, 105))
    def progress(self, data: st.DataObject, percent: int) -> None:
        pk = data.draw(st.sampled_from(list(self.tokens)))
        try:
            services.report_progress(pk, self.tokens[pk], percent, "p", now=self.now)
            assert 0 <= percent <= 100
        except ValidationError:
            assert not 0 <= percent <= 100
        except CancelRequested:
            assert Job.objects.get(pk=pk).cancel_requested_at is not None

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        pk = data.draw(st.sampled_from(list(self.tokens)))
        services.heartbeat(pk, self.tokens[pk], lease_seconds=LEASE, now=self.now)

    @precondition(lambda self: self.tokens)
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["complete", "partial", "fail", "fail_retry", "cancel"]),
        by_id=st.booleans(),
        input_changed=st.booleans(),
    )
    def finish(self, data: st.DataObject, outcome: str, by_id: bool, input_changed: bool) -> None:
        pk = data.draw(st.sampled_from(list(self.tokens)))
        token = self.tokens[pk]
        if input_changed:
            self._input_changes(pk, 1)
        if outcome == "complete":
            self._complete(pk, token, by_id)
        elif outcome == "partial":
            services.mark_partial(pk, token, {"ok": 0}, "half", now=self.now)
        elif outcome == "cancel":
            services.cancel_now(Job.objects.get(pk=pk), token)
        else:
            services.fail(pk, token, "boom", retry=outcome == "fail_retry", retry_delay=5, now=self.now)
        self._drop_token(pk)

    def _complete(self, pk: Any, token: Any, by_id: bool) -> None:
        """The watermark rule: the run saw the watermark of its claim; if the input
        moved past it meanwhile, exactly one new job with the key is queued."""
        job = Job.objects.get(pk=pk)  # a fresh copy: it already holds any raised watermark
        seen, current = self.claimed_at[pk], job.input_watermark
        if job.key is not None:
            assert not self._same_key(job).filter(status=Status.QUEUED).exists()  # it held the key
        services.complete(pk if by_id else job, token, {"ok": 1}, now=self.now)
        done = Job.objects.get(pk=pk)
        assert done.status == Status.COMPLETED and done.last_success_watermark == seen
        if job.key is None:
            return
        queued = list(self._same_key(job).filter(status=Status.QUEUED))
        if current is not None and (seen is None or current > seen):
            (rerun,) = queued
            assert rerun.input_watermark == current and rerun.parameters == job.parameters
            assert rerun.events.get().actor_label == "system:watermark"
        else:
            assert queued == []

    @precondition(lambda self: self.stale)
    @rule(data=st.data(), call=st.sampled_from(["heartbeat", "progress", "complete", "fail"]))
    def stale_token_is_refused(self, data: st.DataObject, call: str) -> None:
        pk, token = data.draw(st.sampled_from(self.stale))
        before = self._snapshot(pk)
        with pytest.raises(LeaseLost):
            if call == "heartbeat":
                services.heartbeat(pk, token, now=self.now)
            elif call == "progress":
                services.report_progress(pk, token, 50, now=self.now)
            elif call == "complete":
                services.complete(pk, token, {"late": 1}, now=self.now)
            else:
                services.fail(pk, token, "late", now=self.now)
        assert self._snapshot(pk) == before

    @rule(data=st.data())
    def request_cancel(self, data: st.DataObject) -> None:
        pk = self._pick(data)
        if pk is None:
            return
        status = Job.objects.get(pk=pk).status
        try:
            job = services.request_cancel(pk, "api", "test")
        except InvalidTransition as exc:
            assert status in TERMINAL and exc.current == status
            return
        if status == Status.QUEUED:
            assert job.status == Status.CANCELLED
        else:
            assert job.status == Status.PROCESSING and job.cancel_requested_at is not None

    @rule(seconds=st.sampled_from([1, 10, LEASE + 1]))
    def time_passes_and_reaper_runs(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)
        report = services.requeue_expired(self.now)
        for pk in [*report.requeued, *report.failed, *report.cancelled]:
            self._drop_token(pk)
        assert not Job.objects.expired(self.now).exists()

    @rule(data=st.data())
    def retry_terminal(self, data: st.DataObject) -> None:
        pk = self._pick(data)
        if pk is None:
            return
        old = Job.objects.get(pk=pk)
        retried = Job.objects.filter(retry_of=pk).exists()
        try:
            new = services.retry(pk, "admin")
        except InvalidTransition:
            assert old.status not in TERMINAL
            return
        except AlreadyRetried:
            assert old.status in TERMINAL and retried  # a job is retried once
            return
        except services.DuplicateActiveKey:
            assert old.key is not None
            return
        assert not retried
        assert old.status in TERMINAL and new.retry_of_id == pk and new.status == Status.QUEUED

    # -- invariants ----------------------------------------------------
    @invariant()
    def statuses_progress_and_history_agree(self) -> None:
        jobs = {j.pk: j for j in Job.objects.all()}
        events: dict[Any, list[JobEvent]] = {}
        for event in JobEvent.objects.order_by("id"):
            events.setdefault(event.job_id, []).append(event)
        for pk, job in jobs.items():
            assert job.status in Status.values
            assert 0 <= job.progress <= 100
            replay = ""
            for event in events.get(pk, []):
                assert event.from_status == replay, (pk, event.transition)
                replay = event.to_status
            assert replay == job.status
            if job.status == Status.PROCESSING:
                assert job.lease_token is not None
                assert self.tokens.get(pk) == job.lease_token
            else:
                assert pk not in self.tokens

    @invariant()
    def terminal_jobs_never_change(self) -> None:
        for pk, snapshot in self.terminal.items():
            assert self._snapshot(pk) == snapshot
        for pk in Job.objects.filter(status__in=TERMINAL).values_list("pk", flat=True):
            self.terminal.setdefault(pk, self._snapshot(pk))

    @invariant()
    def no_two_live_leases(self) -> None:
        tokens = list(Job.objects.filter(status=Status.PROCESSING).values_list("lease_token", flat=True))
        assert len(tokens) == len(set(tokens))


JobLifecycle.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
@pytest.mark.django_db
def test_job_lifecycle_state_machine() -> None:
    JobLifecycle.TestCase().runTest()
