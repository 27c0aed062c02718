"""The plain-SQL hot writes (``services._writes.update_job``) keep the ORM path's guards."""

from __future__ import annotations

import pytest

from jobstate import services
from jobstate.exceptions import LeaseLost
from jobstate.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def running() -> Job:
    services.enqueue("test.echo", {})
    (job,) = services.claim("h:1:2", kinds=["test.echo"], start=True)
    return job


def test_progress_and_heartbeat_without_a_token_are_refused(running):
    with pytest.raises(LeaseLost):
        services.report_progress(running.pk, None, 50, "no lease")  # type: ignore[arg-type]
    with pytest.raises(LeaseLost):
        services.heartbeat(running.pk, None)  # type: ignore[arg-type]
    row = Job.objects.get(pk=running.pk)
    assert row.progress == 0 and row.progress_message == ""


def test_progress_under_another_token_is_refused_and_under_its_own_stored(running):
    import uuid

    with pytest.raises(LeaseLost):
        services.report_progress(running.pk, uuid.uuid4(), 50)
    services.report_progress(running.pk, running.lease_token, 40, "mine", step="s1")
    row = Job.objects.get(pk=running.pk)
    assert (row.progress, row.progress_message, row.current_step) == (40, "mine", "s1")
