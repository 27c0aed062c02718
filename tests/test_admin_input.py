"""Bad input to the admin lists and bulk actions: a clear answer, nothing written,
never a 500. Only the declared filters (and the links the admin builds) filter."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import OperationalError, connection
from django.urls import reverse

from jobstate import services
from jobstate.admin import filters
from jobstate.ids import short
from jobstate.models import Job, JobEvent, WorkerProcess
from jobstate.states import Status
from tests.admin_support import processing, queued

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:jobstate_job_changelist")
ASSETS = reverse("admin:jobstate_asset_changelist")
EVENTS = reverse("admin:jobstate_jobevent_changelist")
WORKERS = reverse("admin:jobstate_workerprocess_changelist")


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def listed(html: str, job: Job) -> bool:
    return reverse("admin:jobstate_job_change", args=[job.pk]) in html


def assert_cleared(client: Any, url: str, query: str) -> None:
    """Django's answer to invalid lookups: the unfiltered list, with a message."""
    response = client.get(f"{url}?{query}")
    assert response.status_code == 302, query
    assert response["Location"] == f"{url}?e=1", query
    page = client.get(response["Location"])
    assert page.status_code == 200, query
    assert "The filters were not valid and have been cleared" in page.content.decode(), query


@pytest.fixture
def worker_row() -> WorkerProcess:
    return WorkerProcess.objects.create(
        name="host:1:1", cluster="web-1", host="host", pid=1, role=WorkerProcess.Role.WORKER
    )


# --- lookups nobody declared --------------------------------------------------------


UNDECLARED = {
    JOBS: (
        "key__regex=(",
        "key__regex=(a%2B)%2B$",
        "key__startswith=x",
        "kind__iregex=.",
        "error_message__contains=x",
        "status__in=queued",
        "owner__username__regex=(",
        "owner__password__startswith=pbkdf2",
        "created_at__gt=2020-01-01",
        "created_at__isnull=False",
        "created_at__week_day=1",
        "parent__id__exact=",  # the child-jobs link's lookup, without an id
        "parent__id__exact=x",
        "parent__key__regex=(",
        "id__regex=(",
    ),
    ASSETS: ("name__regex=(", "asset_type__startswith=r", "job__key__regex=(", "job_id=x"),
    EVENTS: ("reason__regex=(", "job__key__regex=(", "to_status=queued"),
    WORKERS: ("name__regex=(", "host__startswith=x", "role__regex=(", "role=worker", "job_id=x"),
}


@pytest.mark.parametrize("url", list(UNDECLARED))
def test_lookups_that_no_filter_declares_are_refused(admin_client: Any, url: str, worker_row: Any) -> None:
    processing()
    for query in UNDECLARED[url]:
        assert_cleared(admin_client, url, query)


def test_the_links_the_admin_builds_still_filter(admin_client: Any, admin_user: Any, user: Any) -> None:
    parent = queued(user, kind="test.limited", key="the-parent")
    child = queued(parent=parent)
    other = processing()
    # The job page's "child jobs" link.
    page = admin_client.get(reverse("admin:jobstate_job_change", args=[parent.pk])).content.decode()
    link = re.search(r'href="([^"]*\?parent__id__exact=[^"]+)"', page)
    assert link is not None
    html = admin_client.get(link.group(1)).content.decode()
    assert listed(html, child) and not listed(html, parent) and not listed(html, other)
    day = parent.created_at
    for query, shown, hidden in (
        ("status=queued", parent, other),
        ("status=active", other, None),
        ("kind=test.limited", parent, other),
        (f"owner={user.pk}", parent, other),
        ("owner=none", other, parent),
        ("owner=-1", None, parent),
        ("stuck=any", None, parent),
        (
            f"created_at__year={day.year}&created_at__month={day.month}&created_at__day={day.day}",
            parent,
            None,
        ),
        (f"created_at__month={day.month}", parent, None),
        (f"created_at__day={day.day}", parent, None),
        (f"created_at__gte={day.date()}&created_at__lt=2999-01-01", parent, None),
        ("created_at__lt=2000-01-01", None, parent),
        ("q=the-parent", parent, other),
        ("o=-8", parent, None),
        ("p=1", parent, None),
    ):
        response = admin_client.get(f"{JOBS}?{query}")
        assert response.status_code == 200, query
        html = response.content.decode()
        assert shown is None or listed(html, shown), query
        assert hidden is None or not listed(html, hidden), query


def test_the_other_lists_keep_their_filters(admin_client: Any, media: Any, worker_row: Any) -> None:
    job = processing()
    asset = services.add_asset(job, asset_type="report", name="a.csv", content=b"x", token=job.lease_token)
    day = asset.created_at.date()
    for url, query, text in (
        (ASSETS, "type=report", "a.csv"),
        (ASSETS, f"job={job.pk}", "a.csv"),
        (ASSETS, f"created_at__gte={day}&created_at__lt=2999-01-01", "a.csv"),
        (EVENTS, f"job={job.pk}", short(job.pk)),
        (WORKERS, "role__exact=worker", "host:1:1"),
        (WORKERS, "cluster=web-1", "host:1:1"),
        (WORKERS, "cluster__isnull=False", "host:1:1"),
        (WORKERS, "q=host", "host:1:1"),
    ):
        response = admin_client.get(f"{url}?{query}")
        assert response.status_code == 200, (url, query)
        assert text in response.content.decode(), (url, query)


@pytest.fixture
def media(settings: Any, tmp_path: Any) -> Any:
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


# --- values the database refuses ------------------------------------------------------


def test_an_owner_id_out_of_range_or_malformed_clears_the_filters(admin_client: Any) -> None:
    queued()
    for value in ("99999999999999999999999", "-99999999999999999999999", "9223372036854775808", "1.5", "abc"):
        assert_cleared(admin_client, JOBS, f"owner={value}")


def test_a_time_zone_the_database_refuses_clears_the_filters(admin_client: Any) -> None:
    job = queued()
    # PostgreSQL refuses an offset beyond 15:59; SQLite stores the time in UTC.
    response = admin_client.get(f"{JOBS}?created_at__gte=2000-01-01+00:00:00%2B23:00")
    if connection.vendor == "postgresql":
        assert_cleared(admin_client, JOBS, "created_at__gte=2000-01-01+00:00:00%2B23:00")
    else:
        assert response.status_code == 200 and short(job.pk) in response.content.decode()


def test_a_database_error_while_filtering_clears_the_filters(admin_client: Any, monkeypatch: Any) -> None:
    job = queued(key="k")  # SQLite runs the regex on a key that is not NULL

    def broken(self: Any, request: Any, queryset: Any) -> Any:  # SQL the database refuses
        return queryset if self.value() is None else queryset.filter(key__regex="(")

    monkeypatch.setattr(filters.KindFilter, "queryset", broken)
    assert_cleared(admin_client, JOBS, "kind=test.echo")
    # The connection is still usable (a savepoint on PostgreSQL), the job untouched.
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_an_unfiltered_list_does_not_hide_a_database_error(admin_client: Any, monkeypatch: Any) -> None:
    queued()

    def down(self: Any) -> int:
        raise OperationalError("down")

    monkeypatch.setattr("jobstate.admin.paginator.CappedPaginator.count", property(down))
    with pytest.raises(Exception, match="down"):
        admin_client.get(JOBS)


def test_an_object_id_with_a_nul_character_is_a_missing_object(admin_client: Any, worker_row: Any) -> None:
    # A worker process's id is its name (text): PostgreSQL refuses a NUL in it (a 500).
    for suffix in ("change/", "history/"):  # delete/: 403, no one may delete a row
        response = admin_client.get(f"{WORKERS}host:1%001/{suffix}")
        assert response.status_code == 302, suffix
        assert response["Location"] == reverse("admin:index"), suffix
        assert any("Perhaps it was deleted?" in m for m in texts(response)), suffix
    found = admin_client.get(reverse("admin:jobstate_workerprocess_change", args=[worker_row.pk]))
    assert found.status_code == 200


# --- bulk actions ------------------------------------------------------------------------


def post_action(client: Any, url: str, action: str, ids: list[str], **extra: str) -> Any:
    return client.post(url, {"action": action, "_selected_action": ids, "index": 0, **extra})


def test_a_bulk_action_with_malformed_ids_selects_nothing(admin_client: Any) -> None:
    job = queued()
    events = JobEvent.objects.count()
    for ids in (["x"], ["x", ""], [f"{job.pk}x"], ["99999999999999999999999"]):
        response = post_action(admin_client, JOBS, "cancel_selected", ids, confirm="yes", reason="r")
        assert response.status_code == 302, ids
        assert any("Items must be selected" in m for m in texts(response)), ids
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert JobEvent.objects.count() == events
    # The valid ids among malformed ones are acted on.
    response = post_action(
        admin_client, JOBS, "cancel_selected", ["x", str(job.pk)], confirm="yes", reason="r"
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


def test_the_asset_delete_action_with_malformed_ids_selects_nothing(admin_client: Any, media: Any) -> None:
    job = processing()
    services.add_asset(job, asset_type="report", name="a.csv", content=b"x", token=job.lease_token)
    response = post_action(admin_client, ASSETS, "delete_selected", ["x"], post="yes")
    assert response.status_code == 302
    assert any("Items must be selected" in m for m in texts(response))
    assert job.assets.count() == 1


def test_a_bulk_reason_longer_than_the_single_job_form_allows_is_refused(admin_client: Any) -> None:
    job = queued()
    events = JobEvent.objects.count()
    response = post_action(
        admin_client, JOBS, "cancel_selected", [str(job.pk)], confirm="yes", reason="x" * 1001
    )
    assert response.status_code == 200  # the confirmation page again, the reason kept
    html = response.content.decode()
    assert 'name="reason"' in html and "x" * 1001 in html
    assert "Reason: Ensure this value has at most 1000 characters (it has 1001)." in html
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert JobEvent.objects.count() == events
    response = post_action(
        admin_client, JOBS, "cancel_selected", [str(job.pk)], confirm="yes", reason="y" * 1000
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert JobEvent.objects.filter(job=job).latest("id").reason == "y" * 1000


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["", "?status=queued", "?q=k"])
def test_a_filtered_list_outside_a_transaction_opens_none(admin_client: Any, query: str) -> None:
    # On SQLite (IMMEDIATE transactions) one would take the write lock, and every
    # worker's claim and outcome would wait for the admin's count and page.
    from django.test.utils import CaptureQueriesContext

    queued(key="k")
    with CaptureQueriesContext(connection) as seen:
        assert admin_client.get(JOBS + query).status_code == 200
    assert not [
        q["sql"] for q in seen.captured_queries if q["sql"].upper().startswith(("BEGIN", "SAVEPOINT"))
    ]
