"""The django-q2 package that carries one reserved job to a worker process.

Kept apart from ``tasks`` (which runs packages) so that the broker, which builds
them, and ``tasks``, which asks the broker about its cluster, do not import
each other.
"""

from __future__ import annotations

import uuid

from django.utils import timezone

from jobstate import registry
from jobstate.models import Job
from jobstate.worker.q2 import SignedPackage
from jobstate.worker.runner import hard_limit_for

# What a package calls: the dotted path of ``jobstate.worker.tasks.execute``.
EXECUTE = "jobstate.worker.tasks.execute"


def package(job: Job) -> str:
    """A signed django-q2 task package that runs ``job`` in a worker process.

    Slim: the job id, its lease token and its kind, nothing pickled from the
    model; ``execute`` begins the job with one UPDATE that also loads it.
    ``timeout`` is the hard limit after which django-q2 stops the worker
    process; jobstate's own soft timeout and cancel grace come first.
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
            "timeout": hard_limit_for(spec),
            "started": timezone.now(),
        }
    )
    return package
