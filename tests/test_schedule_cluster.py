"""jobstate_schedule --cluster: the reaper's and the prune's schedules pinned to one
django-q2 cluster, and kept there by a rerun without the option."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from django_q.models import Schedule

from jobstate.worker import schedules

pytestmark = pytest.mark.django_db

BOTH = [schedules.REAPER, schedules.PRUNE]


def command(*args: str) -> str:
    out = StringIO()
    call_command("jobstate_schedule", *args, stdout=out)
    return out.getvalue()


def clusters() -> dict[str, str | None]:
    return dict(Schedule.objects.values_list("name", "cluster"))


def test_cluster_installs_the_schedules_for_that_cluster() -> None:
    out = command("--cluster", "jobs")
    assert clusters() == {schedules.REAPER: "jobs", schedules.PRUNE: "jobs"}
    for name in BOTH:
        assert f"created: {name}" in out and f"cluster 'jobs': {name}" in out
    assert "kept" not in out


def test_a_rerun_without_cluster_keeps_the_one_they_have_and_says_so() -> None:
    # It reset the cluster to None on every run: a deploy script's plain
    # jobstate_schedule undid the operator's pinning, and the Redis cluster ran them.
    command("--cluster", "jobs")
    out = command()
    assert clusters() == {schedules.REAPER: "jobs", schedules.PRUNE: "jobs"}
    for name in BOTH:
        assert f"unchanged: {name}" in out and f"kept cluster 'jobs': {name}" in out
    assert f"unchanged: {schedules.REAPER}" in command("--cluster", "jobs")


def test_a_cluster_an_operator_set_in_the_admin_is_kept() -> None:
    command()
    later = timezone.now() + timedelta(minutes=30)
    Schedule.objects.filter(name=schedules.PRUNE).update(cluster="workers", next_run=later)
    out = command()
    assert clusters() == {schedules.REAPER: None, schedules.PRUNE: "workers"}
    assert f"unchanged: {schedules.PRUNE}" in out and f"kept cluster 'workers': {schedules.PRUNE}" in out
    assert "kept cluster" not in out.replace(f"kept cluster 'workers': {schedules.PRUNE}", "")


def test_another_cluster_moves_them_and_keeps_the_next_run() -> None:
    command("--cluster", "jobs")
    later = timezone.now() + timedelta(minutes=30)
    Schedule.objects.update(next_run=later)
    out = command("--cluster", "other")
    assert clusters() == {schedules.REAPER: "other", schedules.PRUNE: "other"}
    assert f"updated: {schedules.REAPER}" in out and f"cluster 'other': {schedules.REAPER}" in out
    assert set(Schedule.objects.values_list("next_run", flat=True)) == {later}


def test_without_cluster_new_schedules_name_none() -> None:
    out = command()
    assert clusters() == {schedules.REAPER: None, schedules.PRUNE: None}
    assert "cluster" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", ""], "--cluster is empty"),
        (["--cluster", "  "], "--cluster is empty"),
        (["--cluster", " jobs"], "has spaces around it"),
        (["--cluster", "x" * 101], "longer than 100 characters"),
        (["--cluster", "jo\x00bs"], "NUL character"),
        (["--cluster", "jobs", "--remove"], "not allowed with --remove"),
    ],
)
def test_a_bad_cluster_is_refused_and_writes_nothing(args: list[str], message: str) -> None:
    command("--cluster", "jobs")
    with pytest.raises(CommandError, match=message):
        command(*args)
    assert clusters() == {schedules.REAPER: "jobs", schedules.PRUNE: "jobs"}


def test_install_refuses_an_empty_or_too_long_cluster() -> None:
    for bad in ("", "x" * (schedules.CLUSTER_MAX_LENGTH + 1)):
        with pytest.raises(ValueError, match="cluster must be"):
            schedules.install(cluster=bad)
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(("cluster_name", "runs"), [("jobs", True), ("jobstate", False)])
def test_django_q2_runs_pinned_schedules_only_in_that_cluster(monkeypatch, cluster_name, runs) -> None:
    # W016's case: a cluster_name other than its name runs no schedule without a
    # cluster, but does run the ones pinned to it; another cluster does not.
    from django_q import scheduler
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "PREFIX", "jobstate")
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name)
    schedules.install(prune=False, cluster="jobs")
    Schedule.objects.update(next_run=timezone.now() - timedelta(minutes=5))
    monkeypatch.setattr(scheduler, "close_old_django_connections", lambda: None)  # the test's transaction
    with mock.patch.object(scheduler, "async_task", return_value="task-id") as sent:
        scheduler.scheduler(broker=mock.Mock())
    assert sent.called is runs
