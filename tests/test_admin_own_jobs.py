"""jobstate's own jobs (webhook deliveries) in the job admin: a delivery that sent
nothing says so and why."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobstate import services
from jobstate.ids import short
from jobstate.models import Job
from jobstate.webhooks import delivery, outbox
from jobstate.webhooks.models import WebhookEndpoint
from jobstate.worker.runner import drain

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
    endpoint, _ = WebhookEndpoint.objects.update_or_create(
        url=url, defaults={"enabled": True, "disabled_reason": ""}
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
