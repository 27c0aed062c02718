"""This django-q2 cluster's name in claims and WorkerProcess rows:
``<hostname>:<qcluster pid>``; its worker processes append their own pid."""

from __future__ import annotations

import os
import socket

_cluster_id: str | None = None


def cluster_id() -> str:
    """``<hostname>:<qcluster pid>`` for claims; workers append their own pid."""
    return _cluster_id or f"{socket.gethostname()}:{os.getppid()}"


def name_cluster() -> None:
    """Fix the name, once, in the sentinel as it builds the broker: the sentinel's
    parent is the qcluster process."""
    global _cluster_id
    if _cluster_id is None:
        _cluster_id = f"{socket.gethostname()}:{os.getppid()}"
