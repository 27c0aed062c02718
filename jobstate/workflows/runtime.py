"""Running a workflow inside its job's handler.

Each run (an attempt, or a wake-up after waiting for children) starts at the
first step that is neither completed nor skipped; completed steps never run
again and their outputs are handed to later steps. The job's own outcome still
goes through the worker runner: a return value completes it, ``Partial`` ends it
partial, ``Suspend`` gives the worker back, and an exception fails the attempt.
A workflow that failed for good (see ``compensation``) runs no step again: each
later run finishes its undos and fails with the original error. One registered
with ``undo_on_cancel`` runs its undos when a cancel stops it, then ends cancelled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError

from jobstate.exceptions import (
    CancelRequested,
    Interrupted,
    LeaseLost,
    NonRetryable,
    Partial,
    StepStateError,
    Suspend,
)
from jobstate.models import JobStep
from jobstate.models.step import STEP_DONE, StepStatus
from jobstate.storable import exception_text, result_value
from jobstate.workflows import compensation, fanout, reuse, step_undos, step_waits, steps
from jobstate.workflows.context import StepContext
from jobstate.workflows.definition import StepSpec, Workflow, undoes_on_cancel

if TYPE_CHECKING:  # types only: the worker is an independent layer
    from jobstate.worker.context import JobContext

logger = logging.getLogger("jobstate")
S = StepStatus


class WorkflowFailed(NonRetryable):
    """A workflow failed for good after undoing its completed steps (the message
    lists them); the step's original exception is the ``__cause__``."""

    def __init__(self, message: str, report: compensation.Report) -> None:
        super().__init__(message)
        self.report = report


class Run:
    """One run of a workflow for one claimed job."""

    def __init__(self, cls: type[Workflow], ctx: JobContext) -> None:
        self.cls = cls
        self.wf = cls()
        self.ctx = ctx
        self.job = ctx.job
        self.token = ctx.token
        self.specs = cls.steps
        self.rows: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}

    def band(self, spec: StepSpec) -> tuple[float, float]:
        """The share of the job's progress (0..100) that ``spec`` covers."""
        total = len(self.specs)
        return 100 * spec.position / total, 100 * (spec.position + 1) / total

    def resumed_at(self, spec: StepSpec, row: JobStep) -> float:
        """The job's progress as ``spec`` begins: its band's start, plus the share its
        checkpoint had reached when it resumes from one (what it reported after that
        checkpoint is not kept: that work runs again)."""
        low, high = self.band(spec)
        return low + (high - low) * steps.resumed_percent(row) / 100

    def execute(self) -> Any:
        if not undoes_on_cancel(self.job.kind):
            return self._execute()
        try:
            return self._execute()
        except (LeaseLost, WorkflowFailed, Partial):
            raise  # the failure's compensation ran (a cancel then ends it cancelled)
        except (Exception, Interrupted) as exc:
            if isinstance(exc, Interrupted) and exc.why == "lease":
                raise
            if not isinstance(exc, CancelRequested) and not self.ctx.cancel_requested:
                raise
            self._compensate_cancel()
            raise CancelRequested(self.job.pk) from exc

    def _execute(self) -> Any:
        names = [s.name for s in self.specs]
        try:
            self.rows = steps.ensure(self.job, self.token, names)
        except CancelRequested:
            # Only compensation outlives a cancel: the failure was decided first.
            self.rows = steps.ensure(self.job, self.token, names, cancel_ok=True)
            if compensation.under_way(self.specs, self.rows) is None:
                raise
        failing = compensation.under_way(self.specs, self.rows)
        if failing is not None:
            self._resume_compensation(*failing)
        undone = [s.name for s in self.specs if self.rows[s.name].status == S.UNDONE]
        if undone:
            raise NonRetryable(f"workflow was already compensated (undone: {', '.join(undone)})")
        for spec in self.specs:
            row = self.rows[spec.name]
            if row.status == S.COMPLETED:
                self.outputs[spec.name] = row.output
            elif row.status == S.SKIPPED:
                self.outputs[spec.name] = None
            else:
                self._step(spec, row)
        result = self.wf.result(dict(self.outputs))
        details = dict(JobStep.objects.filter(job_id=self.job.pk).values_list("name", "detail"))
        notes = [f"{s.name}: {n}" for s in self.specs for n in steps.partial_notes(details.get(s.name) or {})]
        if notes:
            raise Partial("; ".join(notes), result)
        return result

    def _step(self, spec: StepSpec, row: Any) -> None:
        name = spec.name
        spawning = False
        try:
            if row.status != S.WAITING and "children" in row.detail:
                # An earlier run started this step's children: wait for them, never again.
                step_waits.resume_wait(self.job, self.token, row, band=self.band(spec))
            if row.status == S.WAITING:
                output = fanout.fan_in(self, spec, row)
            else:
                steps.begin(self.job, self.token, row, percent=self.resumed_at(spec, row))
                sctx = StepContext(self, spec, row)
                output = self._call(spec, sctx)
                if sctx.spawned:
                    spawning = True
                    try:
                        result_value(output, "output")  # kept with the children: stored once
                    except ValidationError as bad:
                        raise _unstorable(name, "an output", bad) from bad
                    taken = reuse.plan(self.job, name, sctx.spawned)
                    fanout.start(self, spec, sctx, output, taken)  # raises Suspend
            try:
                steps.complete(self.job, self.token, row, output, percent=self.band(spec)[1])
            except ValidationError as bad:
                raise _unstorable(name, "an output", bad) from bad
        except (Suspend, CancelRequested, LeaseLost):
            raise
        except Partial as exc:
            try:
                result = result_value(exc.result, "output")
            except ValidationError as bad:
                # As a handler's unstorable result: a property of the step, not of the
                # attempt (running it again would repeat its effects for the same result).
                failure = _unstorable(name, "a partial result", bad)
                self._failed(spec, failure, str(failure))
                raise failure from exc
            steps.fail(self.job, self.token, row, f"partial: {exception_text(exc)}", output=result)
            raise
        except Interrupted as exc:
            if exc.why == "timeout" and spawning and fanout.is_waiting(row):
                # The timeout hit after the children started: waiting is this run's outcome.
                raise Suspend(f"step '{name}' waits for its child jobs") from None
            if exc.why == "timeout":  # the runner fails this attempt; is it the last one?
                self._failed(spec, exc, "timed out")
            raise
        except Exception as exc:
            self._failed(spec, exc, f"{type(exc).__name__}: {exception_text(exc)}")
            raise
        self.outputs[name] = row.output  # as stored (JSON), as a resumed run reads it

    def _call(self, spec: StepSpec, sctx: StepContext) -> Any:
        kwargs = dict(self.outputs) if spec.all_inputs else {}
        kwargs.update({name: self.outputs.get(name) for name in spec.inputs})
        return getattr(self.wf, spec.method)(sctx, **kwargs)

    def final(self, exc: BaseException) -> bool:
        """Will the runner fail the job for good? Same rule as ``services.fail``."""
        return isinstance(exc, NonRetryable) or self.ctx.attempt >= self.job.max_attempts

    def _failed(self, spec: StepSpec, exc: BaseException, error: str) -> None:
        final = self.final(exc)
        # A failed fan-in keeps its summary (which children failed) as the step's output.
        output = exc.output if isinstance(exc, fanout.ChildrenFailed) else None
        try:
            marked = self._fail(spec, error, final, output=output)
        except StepStateError:
            # The timeout's interrupt (or a database error) came inside this run's own
            # bookkeeping, next to a commit: begin()'s (the step never started) or
            # complete()'s (it completed). Go by the stored rows.
            unstarted = self._unstarted(spec)
            if unstarted is None:
                return
            spec = unstarted
            marked = self._fail(spec, error, final, started=False)
        if not marked:  # attempts left, or a cancel is pending (no undo runs then)
            return
        report = self._compensate(spec.name, error)
        if report:
            raise WorkflowFailed(report.message(spec.name, error), report) from exc

    def _fail(
        self, spec: StepSpec, error: str, final: bool, *, started: bool = True, output: Any = None
    ) -> bool:
        """``steps.fail`` for ``spec``; whether it marked the workflow compensating."""
        row = self.rows[spec.name]
        stamp = row.finished_at  # a failure this call commits writes its own
        try:
            return steps.fail(
                self.job, self.token, row, error, output=output, compensating=final, started=started
            )
        except Interrupted as exc:
            if exc.why != "timeout":
                raise
            # The timeout interrupts a run once, here just before or after the failure
            # was committed: go by the stored row, else the job would end with the step
            # left running (no undo) or marked compensating with its undos never run.
            self._reload()
            row = self.rows[spec.name]
            written = row.status == S.FAILED and row.finished_at != stamp
            if steps.COMPENSATING in row.detail or written:
                return steps.COMPENSATING in row.detail
            return steps.fail(
                self.job, self.token, row, error, output=output, compensating=final, started=started
            )

    def _unstarted(self, spec: StepSpec) -> StepSpec | None:
        """``spec`` if its stored row shows it did not start; the next step not done
        if it completed (None when there is none: nothing fails then)."""
        self._reload()
        if self.rows[spec.name].status != S.COMPLETED:
            return spec
        self.outputs[spec.name] = self.rows[spec.name].output
        later = self.specs[self.specs.index(spec) + 1 :]
        return next((s for s in later if self.rows[s.name].status not in STEP_DONE), None)

    def _reload(self) -> None:
        """Read the step rows again (an interrupt may have come after a commit and
        before this run noted it)."""
        for row in JobStep.objects.filter(job_id=self.job.pk):
            if row.name in self.rows:
                self.rows[row.name] = row

    def _resume_compensation(self, step: str, error: str) -> None:
        """A run after the workflow failed for good (its worker was lost meanwhile):
        finish the undos, then fail with the original error."""
        for spec in self.specs:
            row = self.rows[spec.name]
            if row.status in (S.COMPLETED, S.UNDONE):
                self.outputs[spec.name] = row.output
            elif row.status == S.SKIPPED:
                self.outputs[spec.name] = None
        report = self._compensate(step, error)
        raise WorkflowFailed(report.message(step, error), report)

    def _compensate_cancel(self) -> None:
        """``undo_on_cancel``: the run stopped on a cancel (a step was interrupted,
        or the run began for its undos): run the undos left, last step first."""
        self.ctx.compensating.set()
        self.rows = steps.ensure(self.job, self.token, [s.name for s in self.specs], cancel_ok=True)
        try:
            self._mark_cancel_undos()
            compensation.compensate_cancel(self)
        except Interrupted as exc:
            if exc.why == "lease":
                raise
            self._reload()  # as in _compensate
            # The interrupt may have rolled the mark back; written once (``recovering``).
            self._mark_cancel_undos()
            compensation.compensate_cancel(self)

    def _mark_cancel_undos(self) -> None:
        if compensation.undos_left(self.specs, self.rows):
            step_undos.undoing_cancel(self.job, self.token)

    def _compensate(self, step: str, error: str) -> compensation.Report:
        self.ctx.compensating.set()  # a cancel requested from now on does not stop it
        try:
            return compensation.compensate(self, step, error)
        except Interrupted as exc:
            if exc.why == "lease":
                raise
            # The heartbeat interrupts a run once, here between two undos: go on, from
            # the stored rows (it may have come right after an undo was recorded).
            self._reload()
            return compensation.compensate(self, step, error)


def _unstorable(name: str, what: str, exc: ValidationError) -> NonRetryable:
    detail = "; ".join(exc.messages) or str(exc)
    return NonRetryable(f"step '{name}' returned {what} that cannot be stored: {detail}"[:1000])


def run(cls: type[Workflow], ctx: JobContext) -> Any:
    """Run (or resume) workflow ``cls`` for the job ``ctx`` holds."""
    return Run(cls, ctx).execute()
