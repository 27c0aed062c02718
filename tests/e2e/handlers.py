"""Handlers the end-to-end tests run in real qcluster worker processes
(imported from ``tests/jobs.py`` so that every test process registers them)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import jobstate


@jobstate.handler("e2e.steps", max_attempts=2)
def steps(ctx: Any) -> dict[str, Any]:
    """Report progress step by step, optionally write a CSV asset, return a result."""
    count = int(ctx.parameters.get("steps", 3))
    delay = float(ctx.parameters.get("delay", 0.05))
    for i in range(1, count + 1):
        time.sleep(delay)
        ctx.progress(round(100 * i / count) if i < count else 99, f"step {i} of {count}", step=f"s{i}")
    if ctx.parameters.get("asset"):
        ctx.add_asset("report", "step,done\n" + "".join(f"{i},yes\n" for i in range(count)), name="steps.csv")
    return {"steps": count, "worker": ctx.worker_id, "pid": os.getpid()}


@jobstate.handler("e2e.flaky", max_attempts=3, retry_backoff=0.4)
def flaky(ctx: Any) -> dict[str, Any]:
    """Fail until attempt ``succeed_on`` (never, if it is past max_attempts)."""
    if ctx.attempt < int(ctx.parameters.get("succeed_on", 99)):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@jobstate.handler("e2e.slow", max_attempts=3)
def slow(ctx: Any) -> dict[str, Any]:
    """Tick for ``seconds`` (``first_seconds`` on the first attempt), reporting
    progress; honours cancel at each tick."""
    seconds = float(ctx.parameters.get("seconds", 3))
    if ctx.attempt == 1:
        seconds = float(ctx.parameters.get("first_seconds", seconds))
    tick = float(ctx.parameters.get("tick", 0.1))
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        ctx.progress(min(99, int(100 * elapsed / seconds)), f"attempt {ctx.attempt}: {elapsed:.1f} s")
        time.sleep(tick)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@jobstate.handler("e2e.limited", concurrency=2, max_attempts=1)
def limited(ctx: Any) -> None:
    """Record when each run starts and ends, to check the concurrency limit."""
    record = Path(ctx.parameters["dir"]) / f"{ctx.job.pk}-{ctx.attempt}.json"
    start = time.time()
    time.sleep(float(ctx.parameters.get("seconds", 0.3)))
    record.write_text(json.dumps({"start": start, "end": time.time(), "pid": os.getpid()}))


@jobstate.handler("e2e.stuck", timeout=0.5, max_attempts=1)
def stuck(ctx: Any) -> None:
    """Stuck in C code that never returns to the interpreter: jobstate's soft
    timeout interrupt (SIGUSR1 to this thread) is blocked, so only django-q2's
    hard limit (the guard terminating the process) can end it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGALRM})
    ctypes.CDLL(None).pause()


@jobstate.handler("e2e.deaf", timeout=2, max_attempts=1)
def deaf(ctx: Any) -> None:
    """Swallows every interrupt (jobstate's timeout, django-q2's hard limit): only
    its worker giving it up (jobstate.worker.escalation) ends it."""
    while True:
        try:  # noqa: SIM105 - no suppress(): a signal may land in its own frames
            time.sleep(0.1)
        except BaseException:  # deaf on purpose
            pass


@jobstate.handler("e2e.once", max_attempts=1)
def once(ctx: Any) -> dict[str, Any]:
    """A short job with a single attempt: losing it once fails it for good."""
    time.sleep(float(ctx.parameters.get("seconds", 0.05)))
    return {"worker": ctx.worker_id}


@jobstate.handler("e2e.chaos", max_attempts=5, retry_backoff=0.2)
def chaos(ctx: Any) -> dict[str, Any]:
    """Record this run under its lease token (one file per lease: a second run
    under the same lease is a double run), tick with progress, return."""
    runs = Path(ctx.parameters["dir"])
    record = {"job": str(ctx.job.pk), "attempt": ctx.attempt, "pid": os.getpid(), "start": time.time()}
    try:
        with open(runs / f"{ctx.job.pk}-{ctx.token}.json", "x") as fh:
            json.dump(record, fh)
    except FileExistsError:
        (runs / f"double-{ctx.job.pk}-{ctx.token}-{os.getpid()}.json").write_text(json.dumps(record))
    seconds, tick = float(ctx.parameters.get("seconds", 0.5)), 0.1
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        ctx.progress(min(99, int(100 * elapsed / seconds)))
        time.sleep(tick)
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@jobstate.handler("e2e.asset_then_hang", max_attempts=2)
def asset_then_hang(ctx: Any) -> dict[str, Any]:
    """Store an asset named after the attempt; on the first attempt then hang
    (reporting progress) until the test kills this worker process."""
    ctx.add_asset("report", f"attempt,{ctx.attempt}\n", name=f"attempt-{ctx.attempt}.csv")
    if ctx.attempt == 1:
        for i in range(600):
            ctx.progress(min(99, i + 1), "asset stored; waiting to be killed")
            time.sleep(0.1)
    return {"attempt": ctx.attempt, "pid": os.getpid()}
