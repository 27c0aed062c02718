"""The benchmark's job: three progress updates, full history (jobstate)."""

import time
from typing import Any

import jobstate


@jobstate.handler("bench.drain", max_attempts=1)
def drain_job(ctx: Any) -> dict[str, float]:
    started = time.time()
    for step in (1, 2, 3):
        ctx.progress(25 * step, f"step {step} of 3")
    return {"started": started}
