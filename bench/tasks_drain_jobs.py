"""bench/jobs.py's workload (three progress updates, then a result) as a
``django.tasks`` ``@task`` on jobstate's backend."""

import time

from jobstate.tasks import current
from jobstate.tasks.compat import task


@task(max_attempts=1)
def drain_task(i: int) -> dict[str, float]:
    started = time.time()
    ctx = current()
    for step in (1, 2, 3):
        ctx.progress(25 * step, f"step {step} of 3")
    return {"started": started}
