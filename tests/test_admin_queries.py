"""Query counts of admin pages that must not grow with their rows, nor repeat
a query a page already made."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path

from jobstate.admin.job_columns import JobColumns
from jobstate.models import Job
from tests.admin_support import processing, queued

pytestmark = pytest.mark.django_db


class HostJobAdmin(JobColumns, admin.ModelAdmin):  # type: ignore[type-arg]
    """A host project's own job list reusing the columns, with Django's ChangeList."""

    list_display = ("short_id", "status_col", "kind", "age_col")
    ordering = ("-created_at",)
    change_list_template = "admin/change_list.html"  # Django's: jobstate's links to its own pages


host_site = AdminSite(name="host")
host_site.register(Job, HostJobAdmin)
urlpatterns = [path("host/", host_site.urls)]
HOST_LIST = "/host/jobstate/job/"


def queries(client: Any, url: str) -> list[str]:
    client.get(url)  # warm the session and caches
    with CaptureQueriesContext(connection) as seen:
        response = client.get(url)
        assert response.status_code == 200
    return [q["sql"] for q in seen.captured_queries]


@override_settings(ROOT_URLCONF=__name__)
def test_a_host_list_of_the_status_column_shares_one_stuck_context(admin_client: Any) -> None:
    # Without the job list's own ChangeList no row carries a shared context: one
    # built per row read the database's clock (PostgreSQL) and the served kinds again.
    def grow(n: int) -> None:
        for _ in range(n):
            queued()
            processing()

    grow(1)
    few = queries(admin_client, HOST_LIST)
    grow(9)
    many = queries(admin_client, HOST_LIST)
    assert admin_client.get(HOST_LIST).content.decode().count('class="js-badge') == 20
    assert len(many) == len(few), many
    assert sum("STATEMENT_TIMESTAMP()" in q for q in many) <= 1, many  # PostgreSQL's clock, read once


def test_the_live_dashboard_reads_the_workers_and_the_clock_once(admin_client: Any) -> None:
    # Polled every second or so by every open dashboard: the workers panel was built
    # twice a request (its counts and its HTML), and PostgreSQL's clock read twice.
    from django.urls import reverse

    from tests.test_admin_workers import idle_cluster

    job = processing()
    queued()
    idle_cluster()
    seen = queries(admin_client, f"{reverse('admin:jobstate_job_live')}?dashboard=1&ids={job.pk}")
    panel = [q for q in seen if "jobstate_workerprocess" in q]
    # The session and its user, the jobs shown, the clock (PostgreSQL), the active
    # counts, the workers panel.
    assert len(panel) == 2, panel  # the live processes, then the dead ones shown
    assert sum("STATEMENT_TIMESTAMP()" in q for q in seen) == (connection.vendor == "postgresql"), seen
    assert len(seen) == 4 + len(panel) + (connection.vendor == "postgresql"), seen


def test_the_dashboard_reads_the_clock_once(admin_client: Any) -> None:
    from django.urls import reverse

    processing()
    seen = queries(admin_client, reverse("admin:jobstate_job_dashboard"))
    assert sum("STATEMENT_TIMESTAMP()" in q for q in seen) == (connection.vendor == "postgresql"), seen


def test_the_job_page_loads_the_job_once(admin_client: Any) -> None:
    from django.urls import reverse

    job = processing()
    seen = queries(admin_client, reverse("admin:jobstate_job_change", args=[job.pk]))
    loads = [q for q in seen if q.startswith('SELECT "jobstate_job"."id", "jobstate_job"."kind"')]
    assert len(loads) == 1, seen


def test_the_job_list_reads_the_stored_kinds_once(admin_client: Any) -> None:
    # For the kind filter's choices and the stuck counts (a queued job of a kind no
    # worker serves): one walk of the kind index.
    from django.urls import reverse

    queued()
    queued(kind="test.limited")
    seen = queries(admin_client, reverse("admin:jobstate_job_changelist"))
    walks = [q for q in seen if q.startswith('WITH RECURSIVE v(x) AS ( SELECT MIN("kind")')]
    assert len(walks) == 1, seen
    html = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    assert "?kind=test.limited" in html  # a stored kind among the filter's choices


def test_the_delete_page_reads_the_jobs_below_once(admin_client: Any) -> None:
    # Django's collector loads every job a delete cascades to (``parent``), level by
    # level; the page walked the same levels again to find the active ones among them.
    from django.contrib.admin.utils import NestedObjects
    from django.urls import reverse

    from tests.admin_support import completed

    top = completed()
    for middle in (completed(parent=top), completed(parent=top)):
        queued(parent=middle)
        completed(parent=completed(parent=middle))
    with CaptureQueriesContext(connection) as walk:
        NestedObjects(using=Job.objects.db).collect([Job.objects.get(pk=top.pk)])
    seen = queries(admin_client, reverse("admin:jobstate_job_delete", args=[top.pk]))
    # The session and its user, then the job (``walk`` reads it too), Django's walk,
    # the active retries holding any of the jobs it found (one statement), and the
    # active jobs above the job (one statement).
    assert len(seen) == 2 + len(walk.captured_queries) + 2, seen


def test_a_parents_page_counts_a_large_fan_out_in_as_many_queries_whatever_its_size(
    admin_client: Any, monkeypatch: Any
) -> None:
    # Past the children it lists, the page counts them by status in one grouped query:
    # a constant number of queries, whatever the number of children.
    from django.urls import reverse

    from jobstate.admin import job_page
    from tests.admin_support import completed, failed

    monkeypatch.setattr(job_page, "CHILDREN_SHOWN", 2)
    parent = processing()
    page = reverse("admin:jobstate_job_change", args=[parent.pk])
    failed(parent=parent)
    for _ in range(2):
        queued(parent=parent)
    few = queries(admin_client, page)
    for _ in range(8):
        completed(parent=parent)
        queued(parent=parent)
    many = queries(admin_client, page)
    assert len(many) == len(few), many
    assert ">19 child jobs</a>" in admin_client.get(page).content.decode()


def _plan(sql: str) -> str:
    with connection.cursor() as cursor:
        explain = "EXPLAIN" if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN"
        cursor.execute(f"{explain} {sql}")
        return str(cursor.fetchall())


# Committed rows, which VACUUM marks all-visible (``vacuumed_jobs``).
@pytest.mark.django_db(transaction=True)
def test_a_parents_page_reads_only_the_children_it_shows_through_the_parent_status_index(
    admin_client: Any, vacuumed_jobs: Any
) -> None:
    # The page read its children twice: ranked failed first (every child sorted for
    # the first 21), then counted by status. It counts them from the (parent, status)
    # index alone and then reads the rows it shows, each status's by that index.
    from django.urls import reverse
    from django.utils import timezone

    from jobstate.admin import job_page
    from jobstate.states import Status

    parent = processing()
    now = timezone.now()

    def jobs(n: int, status: str, of: Job | None) -> list[Job]:
        ended = {"finished_at": now} if status != Status.QUEUED else {}
        error = {"error_message": "boom"} if status == Status.FAILED else {}
        return [Job(kind="test.echo", status=status, parent=of, **ended, **error) for _ in range(n)]

    Job.objects.bulk_create(
        jobs(1000, Status.COMPLETED, None)  # other jobs
        + jobs(300, Status.QUEUED, None)
        + jobs(200, Status.FAILED, None)
        + jobs(1500, Status.COMPLETED, parent)  # the parent's
        + jobs(30, Status.QUEUED, parent)
        + jobs(5, Status.FAILED, parent)
    )
    vacuumed_jobs()
    page = reverse("admin:jobstate_job_change", args=[parent.pk])
    html = admin_client.get(page).content.decode()
    assert ">1,535 child jobs</a>" in html and "5 failed</a> · " in html
    listed = html[html.index('class="js-children"') :]
    listed = listed[: listed.index("</ul>")]
    assert (
        listed.count("js-badge-failed") == 5
        and listed.count("js-badge-queued") == job_page.CHILDREN_SHOWN - 5
    )

    ours = [sql for sql in queries(admin_client, page) if "parent_id" in sql and "retry_of_id" not in sql]
    (count,) = [sql for sql in ours if "GROUP BY" in sql]
    shown = [sql for sql in ours if "GROUP BY" not in sql]
    if connection.vendor == "postgresql":
        assert "Index Only Scan using jobstate_job_parent_status_idx" in _plan(count)
        for sql in shown:
            plan = _plan(sql)
            assert "Index Scan using jobstate_job_parent_status_idx" in plan and "Sort" not in plan, plan
    else:
        assert "USING COVERING INDEX jobstate_job_parent_status_idx (parent_id=?)" in _plan(count)
        for sql in shown:
            plan = _plan(sql)
            assert "INDEX jobstate_job_parent_status_idx (parent_id=? AND status>? AND status<?)" in plan, (
                plan
            )
            assert "TEMP B-TREE" not in plan, plan
    assert len(shown) == 2, shown  # the failed ones, then 15 of the queued ones
