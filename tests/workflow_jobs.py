"""Workflows the tests run, in-process and in real worker processes (imported from
``tests/jobs.py``). Every step records an ``Effect`` row so that tests can count
how often it really ran, across crashes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jobstate
from jobstate.exceptions import NonRetryable
from tests.models import Effect


class SimulatedCrash(BaseException):
    """Escapes the runner like a dying process: nothing is written, the job stays
    ``processing`` with its lease until the reaper takes it back."""


def effect(ctx: Any, label: str, item: int | None = None) -> None:
    Effect.objects.create(job_id=ctx.job.pk, label=label, item=item, attempt=ctx.attempt, pid=os.getpid())


def crash_point(ctx: Any, where: str) -> None:
    """Crash here on the first attempt if the job's parameters say so: ``raise`` a
    SimulatedCrash (in-process tests) or ``hang`` until the test SIGKILLs us after
    seeing the ``marker`` file. ``crash_once`` crashes the first time only (a run
    that recovers a lost one keeps its attempt number); ``crash_always`` every time."""
    params = ctx.parameters
    if params.get("crash_at") != where:
        return
    if params.get("crash_once"):
        if Effect.objects.filter(job_id=ctx.job.pk, label=f"crash:{where}").exists():
            return
        effect(ctx, f"crash:{where}")
    elif not params.get("crash_always") and ctx.attempt != params.get("crash_attempt", 1):
        return
    if params.get("mode", "raise") == "raise":
        raise SimulatedCrash(where)
    # Written whole, then renamed: the test reads the pid as soon as the file exists.
    marker = Path(params["marker"])
    partial = marker.with_suffix(".tmp")
    partial.write_text(str(os.getpid()))
    partial.replace(marker)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError("was not killed")


@jobstate.workflow("wf.five", max_attempts=3, retry_backoff=0, api=True)
class Five(jobstate.Workflow):
    """Five steps; each output builds on the one before."""

    def _run(self, ctx: Any, previous: int) -> int:
        effect(ctx, f"{ctx.step}:start")
        crash_point(ctx, ctx.step)
        time.sleep(float(ctx.parameters.get("delay", 0)))
        effect(ctx, ctx.step)
        return previous + 1

    @jobstate.step()
    def s1(self, ctx: Any) -> int:
        return self._run(ctx, 0)

    @jobstate.step()
    def s2(self, ctx: Any, s1: int) -> int:
        return self._run(ctx, s1)

    @jobstate.step()
    def s3(self, ctx: Any, s2: int) -> int:
        return self._run(ctx, s2)

    @jobstate.step()
    def s4(self, ctx: Any, s3: int) -> int:
        return self._run(ctx, s3)

    @jobstate.step()
    def s5(self, ctx: Any, **outputs: int) -> dict[str, Any]:
        return {"sum": self._run(ctx, outputs["s4"]), "seen": sorted(outputs)}


@jobstate.workflow("wf.batch", max_attempts=3, retry_backoff=0)
class Batched(jobstate.Workflow):
    """A batched step over ``n`` items; ``atomic`` makes each batch one transaction."""

    @jobstate.step()
    def prepare(self, ctx: Any) -> dict[str, int]:
        effect(ctx, "prepare")
        return {"n": int(ctx.parameters.get("n", 100))}

    @jobstate.step(batch=10)
    def load(self, ctx: Any, prepare: dict[str, int]) -> dict[str, Any]:
        effect(ctx, "load:start", ctx.cursor)
        delay = float(ctx.parameters.get("delay", 0))
        items = range(prepare["n"])
        if ctx.parameters.get("atomic"):
            for batch in ctx.batches(items):
                with batch:
                    for i in batch:
                        effect(ctx, "item", i)
                        if i == ctx.parameters.get("crash_item"):
                            crash_point(ctx, "load")
                        time.sleep(delay)
        else:
            for i in ctx.iterate(items):
                effect(ctx, "item", i)
                if i == ctx.parameters.get("crash_item"):
                    crash_point(ctx, "load")
                time.sleep(delay)
        return {"loaded": prepare["n"]}

    @jobstate.step()
    def report(self, ctx: Any, load: dict[str, Any]) -> dict[str, Any]:
        effect(ctx, "report")
        return {"loaded": load["loaded"]}


@jobstate.workflow("wf.saga", max_attempts=2, retry_backoff=0)
class Saga(jobstate.Workflow):
    """Book, charge, notify, then ship, which fails; book and charge have undos."""

    @jobstate.step(undo="cancel_booking")
    def book(self, ctx: Any) -> dict[str, str]:
        effect(ctx, "book")
        return {"booking": "B1"}

    @jobstate.step(undo="refund")
    def charge(self, ctx: Any, book: dict[str, str]) -> dict[str, Any]:
        effect(ctx, "charge")
        return {"charge": "C1", "for": book["booking"]}

    @jobstate.step()
    def notify(self, ctx: Any) -> None:
        effect(ctx, "notify")

    @jobstate.step(undo="unship")
    def ship(self, ctx: Any) -> None:
        crash_point(ctx, "ship")
        effect(ctx, "ship")
        if ctx.parameters.get("non_retryable"):
            raise NonRetryable("address does not exist")
        raise RuntimeError("carrier down")

    def cancel_booking(self, ctx: Any, output: dict[str, str]) -> None:
        crash_point(ctx, "undo:book")
        effect(ctx, f"undo:book:{output['booking']}")
        if ctx.parameters.get("undo_fails") == "book":
            raise RuntimeError("booking system down")

    def refund(self, ctx: Any, output: dict[str, Any]) -> None:
        crash_point(ctx, "undo:charge")
        effect(ctx, f"undo:charge:{output['charge']}")

    def unship(self, ctx: Any, output: Any) -> None:
        effect(ctx, "undo:ship")  # never: ship did not complete


@jobstate.handler("wf.child", max_attempts=1, api=False)  # a fan-out child: internal
def child(ctx: Any) -> dict[str, int]:
    i = int(ctx.parameters["i"])
    ctx.progress(50, f"child {i}")
    time.sleep(float(ctx.parameters.get("delay", 0)))
    if i in ctx.parameters.get("fail", []):
        raise NonRetryable(f"child {i} failed")
    return {"i": i, "square": i * i}


class _Fan(jobstate.Workflow):
    @jobstate.step()
    def split(self, ctx: Any) -> dict[str, int]:
        effect(ctx, "split")
        if note := ctx.parameters.get("mark_partial"):
            ctx.mark_partial(note)
        n = int(ctx.parameters.get("n", 10))
        for i in range(n):
            ctx.spawn(
                "wf.child",
                {"i": i, "fail": ctx.parameters.get("fail", []), "delay": ctx.parameters.get("delay", 0)},
            )
        return {"spawned": n}

    @jobstate.step()
    def merge(self, ctx: Any, split: dict[str, Any]) -> dict[str, Any]:
        effect(ctx, "merge")
        squares = [r["square"] for r in split["results"] if r]
        return {"total": split["total"], "sum": sum(squares), "value": split["value"]}


@jobstate.workflow("wf.fan", max_attempts=2)
class Fan(_Fan):
    """A failed child fails the workflow."""


@jobstate.workflow("wf.fan_partial", max_attempts=2)
class FanPartial(_Fan):
    """A failed child makes the workflow partial (merge still runs)."""

    @jobstate.step(on_child_failure="partial")
    def split(self, ctx: Any) -> dict[str, int]:
        return _Fan.split(self, ctx)


@jobstate.workflow("wf.service", max_attempts=1, timeout=60)
class Service(jobstate.Workflow):
    """prepare -> serve (until asked to stop) -> collect."""

    @jobstate.step()
    def prepare(self, ctx: Any) -> dict[str, str]:
        effect(ctx, "prepare")
        return {"url": "http://127.0.0.1:9/"}

    @jobstate.step()
    def serve(self, ctx: Any, prepare: dict[str, str]) -> dict[str, Any]:
        ctx.serving(f"serving on {prepare['url']}")
        effect(ctx, "serving")
        crash_point(ctx, "serve")
        stopped = ctx.wait_for_stop(timeout=float(ctx.parameters.get("serve_for", 30)), poll=0.1)
        effect(ctx, "stopping")
        return {"stopped": stopped}

    @jobstate.step()
    def collect(self, ctx: Any, serve: dict[str, Any]) -> dict[str, Any]:
        effect(ctx, "collect")
        return {"stopped_on_request": serve["stopped"]}


@jobstate.workflow("wf.fixable", max_attempts=1)
class Fixable(jobstate.Workflow):
    """``two`` fails until an Effect labelled ``fixed`` exists."""

    @jobstate.step()
    def one(self, ctx: Any) -> dict[str, int]:
        effect(ctx, "one")
        return {"value": 1}

    @jobstate.step()
    def two(self, ctx: Any, one: dict[str, int]) -> dict[str, int]:
        effect(ctx, "two")
        if not Effect.objects.filter(label="fixed").exists():
            raise RuntimeError("two is broken")
        return {"value": one["value"] + 1}

    @jobstate.step()
    def three(self, ctx: Any, one: dict[str, int], two: dict[str, int] | None) -> dict[str, Any]:
        effect(ctx, "three")
        return {"one": one["value"], "two": two["value"] if two else None}


class _Provision(jobstate.Workflow):
    """Provision a cluster, reserve a slot, work on them (in place or fanned out),
    report. ``cancel_in``: the step that asks for its own job's cancel (as a user
    would meanwhile). ``child_kind`` and ``child_parameters``: what it fans out
    (``wf.child`` by default)."""

    @jobstate.step(undo="deprovision")
    def provision(self, ctx: Any) -> dict[str, str]:
        effect(ctx, "provision")
        return {"cluster": "K1"}

    @jobstate.step(undo="release")
    def reserve(self, ctx: Any) -> dict[str, str]:
        effect(ctx, "reserve")
        return {"slot": "S1"}

    @jobstate.step()
    def work(self, ctx: Any) -> None:
        effect(ctx, "work")
        kind = ctx.parameters.get("child_kind", "wf.child")
        parameters = ctx.parameters.get("child_parameters", {})
        for i in range(int(ctx.parameters.get("fan_out", 0))):
            ctx.spawn(kind, {**parameters, "i": i})
        if ctx.parameters.get("cancel_in") == "work":
            from jobstate import services

            services.request_cancel(ctx.job.pk, "ops", "not needed")
            if not ctx.parameters.get("fan_out"):
                ctx.check_cancelled()

    @jobstate.step()
    def report(self, ctx: Any) -> None:
        effect(ctx, "report")

    def deprovision(self, ctx: Any, output: dict[str, str]) -> None:
        _slow_undo(ctx)
        effect(ctx, f"undo:provision:{output['cluster']}")

    def release(self, ctx: Any, output: dict[str, str]) -> None:
        crash_point(ctx, "undo:reserve")
        _slow_undo(ctx)
        if ctx.parameters.get("undo_checks"):  # as a long undo would
            ctx.heartbeat()
            ctx.check_cancelled()
        effect(ctx, f"undo:reserve:{output['slot']}")
        if ctx.parameters.get("release_fails"):
            raise RuntimeError("slot service down")


def _slow_undo(ctx: Any) -> None:
    """``undo_seconds``: each undo takes that long (in short sleeps an interrupt can break)."""
    end = time.monotonic() + float(ctx.parameters.get("undo_seconds", 0))
    while time.monotonic() < end:
        time.sleep(0.01)


@jobstate.workflow("wf.provision", max_attempts=2, retry_backoff=0)
class Provision(_Provision):
    """A cancel runs no undo (the default)."""


@jobstate.workflow("wf.provision_undo", max_attempts=2, retry_backoff=0, undo_on_cancel=True)
class ProvisionUndo(_Provision):
    """A cancel runs the undos of the completed steps."""
