"""jobstate's own jobs (webhook deliveries) in the job admin: a filter keeps them
apart from the project's, and a delivery that sent nothing says so and why."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobstate import services
from jobstate.admin.filters import OriginFilter
from jobstate.admin.jobs import JobAdmin
from jobstate.ids import short
from jobstate.models import Job
from jobstate.states import Status
from jobstate.webhooks import delivery, outbox
from jobstate.webhooks.models import WebhookEndpoint
from jobstate.worker.runner import drain
from tests.admin_support import failed

pytestmark = pytest.mark.django_db

LIST = reverse("admin:jobstate_job_changelist")
ALLOW = {"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_BACKOFF_BASE": 0}
DISABLED = "disabled after 5 failed attempts in a row; the last: HTTP 500. " + delivery.REENABLE


@pytest.fixture(autouse=True)
def fresh_answers() -> Any:
    outbox.forget()
    yield
    outbox.forget()


def queue_deliveries(url: str, jobs: int = 1) -> list[Job]:
    """One delivery of each of ``jobs`` completed jobs, queued (not run yet)."""
    staff = get_user_model().objects.filter(is_superuser=True, is_active=True).first()
    staff = staff or get_user_model().objects.create_superuser("hooks-admin", password="x")
    endpoint, _ = WebhookEndpoint.objects.update_or_create(  # global: a staff user answers for it
        url=url, defaults={"enabled": True, "disabled_reason": "", "answerable": staff}
    )
    outbox.forget()  # the events enabled endpoints want, cached
    for _ in range(jobs):
        services.enqueue("test.echo", {})
    drain(kinds=["test.echo"])
    return list(Job.objects.filter(kind=outbox.KIND, status="queued", parameters__endpoint=endpoint.pk))


def skipped_deliveries(n: int = 1) -> list[Job]:
    """Deliveries run after their endpoint was disabled: each completes, skipped."""
    url = "http://127.0.0.1:9/hooks"
    queued = queue_deliveries(url, n)
    WebhookEndpoint.objects.filter(url=url).update(enabled=False, disabled_reason=DISABLED)
    drain()
    done = list(Job.objects.filter(pk__in=[j.pk for j in queued]))
    assert [j.result for j in done] == [{"skipped": f"endpoint disabled: {DISABLED}"}] * n
    return done


def row_of(page: str, job: Job) -> str:
    start = page.index(f'data-job="{job.pk}"')
    return page[start : page.index("</tr>", start)]


@override_settings(JOBSTATE=ALLOW)
def test_a_skipped_delivery_says_so_and_why_in_the_list_and_on_its_page(
    admin_client: Any, receiver: Any
) -> None:
    (delivered,) = queue_deliveries(receiver.url)
    drain()
    (skipped,) = skipped_deliveries()
    page = html.unescape(admin_client.get(LIST).content.decode())
    row = row_of(page, skipped)
    assert f'title="endpoint disabled: {DISABLED}">skipped: endpoint disabled</span>' in row, row
    assert "Completed" in row_of(page, delivered) and "skipped" not in row_of(page, delivered)
    job_page = html.unescape(
        admin_client.get(reverse("admin:jobstate_job_change", args=[skipped.pk])).content.decode()
    )
    assert f'<span class="js-flag">skipped</span> endpoint disabled: {DISABLED}' in job_page
    delivered_page = admin_client.get(
        reverse("admin:jobstate_job_change", args=[delivered.pk])
    ).content.decode()
    assert "js-flag" not in delivered_page


def list_queries(client: Any) -> list[str]:
    client.get(LIST)  # warm the session and caches
    with CaptureQueriesContext(connection) as seen:
        assert client.get(LIST).status_code == 200
    return [q["sql"] for q in seen.captured_queries]


def test_the_list_reads_the_reasons_of_its_skipped_deliveries_in_one_query(admin_client: Any) -> None:
    # The list defers results (LIST_DEFERRED): read per row, each skipped delivery
    # would cost a query; its count and its rows' query stay as they were.
    skipped_deliveries(1)
    few = list_queries(admin_client)
    skipped_deliveries(4)
    many = list_queries(admin_client)
    assert len(many) == len(few), many
    assert html.unescape(admin_client.get(LIST).content.decode()).count("skipped: endpoint disabled") == 5
    results = [q for q in many if '"result"' in q]
    assert len(results) == 1 and "IN" in results[0], results


def test_the_live_refresh_shows_a_delivery_that_completed_skipped(admin_client: Any) -> None:
    (job,) = skipped_deliveries()
    answer = admin_client.get(f"{reverse('admin:jobstate_job_live')}?ids={job.pk}").json()
    cells = answer["jobs"][str(job.pk)]
    assert "skipped: endpoint disabled" in cells["cells"]["status_col"]
    assert "endpoint disabled: disabled after 5 failed" in html.unescape(cells["fields"]["status_display"])


def test_a_project_job_whose_result_says_skipped_is_not_marked(admin_client: Any) -> None:
    job = services.enqueue("test.echo", {})
    services.start(job, "w-test", lease_seconds=60)
    job.refresh_from_db()
    services.complete(job, job.lease_token, {"skipped": "its own word"})
    page = admin_client.get(LIST).content.decode()
    assert short(job.pk) in page and "js-flag" not in page


# --- the origin filter ---------------------------------------------------------------


def listed(client: Any, query: str = "") -> set[str]:
    response = client.get(f"{LIST}?{query}")
    assert response.status_code == 200, response
    page = response.content.decode()
    return {j.kind for j in Job.objects.all() if f'data-job="{j.pk}"' in page}


def test_the_origin_filter_lists_the_projects_jobs_or_jobstates_own(admin_client: Any) -> None:
    failed()
    failed(kind=outbox.KIND, parameters={"endpoint": 1})
    assert listed(admin_client) == {"test.echo", outbox.KIND}  # unchosen: every job, as counted
    assert listed(admin_client, "origin=project") == {"test.echo"}
    assert listed(admin_client, "origin=project&status=failed") == {"test.echo"}
    assert listed(admin_client, "origin=jobstate") == {outbox.KIND}
    page = admin_client.get(LIST).content.decode()
    assert "?origin=project" in page and "?origin=jobstate" in page
    response = admin_client.get(f"{LIST}?origin=mine")
    assert response.status_code == 302 and response["Location"] == f"{LIST}?e=1"


def test_the_origin_filter_adds_no_query_to_the_list(admin_client: Any) -> None:
    failed()
    failed(kind=outbox.KIND, parameters={"endpoint": 1})

    def count(query: str) -> int:
        admin_client.get(f"{LIST}?{query}")
        with CaptureQueriesContext(connection) as seen:
            assert admin_client.get(f"{LIST}?{query}").status_code == 200
        return len(seen.captured_queries)

    assert count("origin=project") == count("origin=jobstate") == count("kind=test.echo")


def origin_rows(request: Any, value: str) -> Any:
    chosen = OriginFilter(request, {"origin": [value]}, Job, JobAdmin(Job, admin.site))
    return chosen.queryset(request, Job.objects.all())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_the_projects_failed_jobs_are_read_newest_first_from_an_index(rf: Any) -> None:
    # Deliveries may outnumber the project's jobs: the list's page of the project's
    # failed jobs walks an index newest first (the status one), the kind compared on
    # its rows, and stops at the page, instead of reading and sorting every failed job.
    now = timezone.now()
    rows = [
        Job(
            kind=outbox.KIND if i % 4 else "test.echo",
            status=Status.FAILED if i % 10 < 2 else Status.COMPLETED,
            error_message="boom",
            finished_at=now,
            created_at=now - timedelta(seconds=i),
        )
        for i in range(5000)
    ]
    Job.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    page = origin_rows(rf.get(LIST), "project").filter(status=Status.FAILED).order_by("-created_at")[:51]
    plan = page.explain()
    assert "Index Scan Backward" in plan and "Sort" not in plan and "Seq Scan" not in plan, plan
    assert len(page) == 51 and {(j.kind, j.status) for j in page} == {("test.echo", Status.FAILED)}


def test_an_unknown_origin_is_bad_input(rf: Any) -> None:
    with pytest.raises(IncorrectLookupParameters):
        origin_rows(rf.get(LIST), "all")
