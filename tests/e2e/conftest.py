"""Fixtures for end-to-end tests with real qcluster processes (see support.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.support import QCluster


@pytest.fixture
def media_root(settings, tmp_path):  # type: ignore[no-untyped-def]
    """One MEDIA_ROOT shared by the test process and its clusters."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def qcluster(transactional_db, media_root) -> Iterator[Callable[..., QCluster]]:  # type: ignore[no-untyped-def]
    """Start real clusters: ``qcluster(workers=..., jobstate={...}, q_cluster={...})``.

    Clusters are torn down (process group killed) before the database is
    flushed, whatever the test's outcome; a failing test prints their logs.
    """
    started: list[QCluster] = []

    def start(workers: int = 2, **options: Any) -> QCluster:
        q_cluster = {"workers": workers, **options.pop("q_cluster", {})}
        cluster = QCluster(q_cluster=q_cluster, media_root=media_root, **options)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.stop(graceful=False)  # the database is flushed next: no need to wait
    leftovers = [pid for cluster in started for pid in cluster.pids()]
    for cluster in started:
        print(f"--- qcluster {cluster.pid} log ---\n{cluster.log()[-6000:]}")
        cluster.log_path.unlink(missing_ok=True)
    assert not leftovers, f"cluster processes left running: {leftovers}"
