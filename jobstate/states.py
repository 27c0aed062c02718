"""The job statuses. Transitions between them are declared on ``Job``."""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    QUEUED = "queued", "Queued"
    PROCESSING = "processing", "Processing"
    # Gave its worker back until its last active child ends (a workflow's fan-out);
    # never claimed. The child's final transaction wakes it (``wake``: -> queued).
    WAITING = "waiting", "Waiting for children"
    COMPLETED = "completed", "Completed"
    PARTIAL = "partial", "Partial"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


TERMINAL: frozenset[str] = frozenset({Status.COMPLETED, Status.PARTIAL, Status.FAILED, Status.CANCELLED})
ACTIVE: frozenset[str] = frozenset({Status.QUEUED, Status.WAITING, Status.PROCESSING})


def is_terminal(status: str) -> bool:
    return status in TERMINAL
