"""The plain-SQL hot writes (``services._writes.update_job``) keep the ORM path's guards."""

from __future__ import annotations

import pytest
from django.db import connection

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


def _prepared_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%jobstate_job%"]
        )
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
def test_hot_statements_are_prepared_when_the_connection_allows_it(running, monkeypatch):
    from jobstate.services import _statements

    connection.ensure_connection()
    # As OPTIONS={"prepare_threshold": 5} sets it (the project settings do, unless
    # JOBSTATE_PG_PREPARE=0).
    monkeypatch.setattr(connection.connection, "prepare_threshold", 5)
    assert _statements.prepared()
    before = _prepared_here()
    services.report_progress(running.pk, running.lease_token, 10, "a")
    services.report_progress(running.pk, running.lease_token, 20, "b")
    assert _prepared_here() == before + 1  # once, then reused


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
def test_and_not_when_it_does_not(running, monkeypatch):
    from jobstate.services import _statements

    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", None)  # Django's default
    assert not _statements.prepared()
    before = _prepared_here()
    services.report_progress(running.pk, running.lease_token, 10, "a")
    assert _prepared_here() == before
    assert Job.objects.get(pk=running.pk).progress == 10


def test_recorded_queries_go_through_djangos_cursor(running):
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        services.report_progress(running.pk, running.lease_token, 30, "seen")
    assert len(queries) == 1 and "progress" in queries[0]["sql"]
    assert Job.objects.get(pk=running.pk).progress_message == "seen"
