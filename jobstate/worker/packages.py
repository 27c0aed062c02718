"""The django-q2 package that carries one reserved job to a worker process.

Kept apart from ``tasks`` (which runs packages) so that the broker, which builds
them, does not import the code that runs them.
"""

from __future__ import annotations

import math
import uuid

from django.utils import timezone

from jobstate import conf, registry
from jobstate.models import Job
from jobstate.registry import HandlerSpec
from jobstate.worker.limits import hard_limit_for
from jobstate.worker.q2 import SignedPackage

# Seconds of django-q2's hard limit a chained job must leave unused (its kill
# comes a few seconds after its own deadline; this keeps well clear of it).
CHAIN_MARGIN = 1.0

# What a package calls: the dotted path of ``jobstate.worker.tasks.execute``.
EXECUTE = "jobstate.worker.tasks.execute"


def package(job: Job) -> str:
    """A signed django-q2 task package that runs ``job`` in a worker process.

    Slim: the job id, its lease token and its kind, nothing pickled from the
    model; ``execute`` begins the job with one UPDATE that also loads it.
    ``timeout`` is the hard limit after which django-q2 stops the worker
    process (``task_timeout``); jobstate's own soft timeout and cancel grace
    come first.
    """
    spec = registry.all_handlers().get(job.kind)
    package: str = SignedPackage.dumps(
        {
            "id": uuid.uuid4().hex,
            "name": f"{job.kind} {job.pk}"[:100],
            "func": EXECUTE,
            "args": (str(job.pk), str(job.lease_token), job.kind),
            "kwargs": {},
            "group": "jobstate",
            "save": False,
            "ack_failure": True,
            "timeout": task_timeout(spec),
            "started": timezone.now(),
        }
    )
    return package


def task_timeout(spec: HandlerSpec | None) -> int:
    """The hard limit django-q2 arms for a package of this kind: the job's own
    (``hard_limit_for``), plus room for the jobs the worker process may chain
    after it (``WORKER_CHAIN_SECONDS``: a chained job starts within that many
    seconds and must end within its own hard limit, so kinds with hard limits up
    to this one's can follow it; ``jobstate.worker.tasks.chain``)."""
    chain = float(conf.get("WORKER_CHAIN_SECONDS") or 0)
    return hard_limit_for(spec) + (math.ceil(chain + CHAIN_MARGIN) if chain > 0 else 0)
