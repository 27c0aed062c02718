"""The admin in a real browser: log in, cancel a job with a reason, requeue a stuck
job, cancel a queued job no worker serves, and see the dashboard's SVG charts drawn."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobstate.ids import short
from jobstate.models import Job, JobEvent
from jobstate.states import Status
from tests.admin_support import completed, expired, failed, queued
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_journey(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    target = queued(user, parameters={"report": "monthly", "month": "2026-10"})
    lost = expired(user)
    for minutes in (1, 3, 8, 20):
        job = completed(user)
        Job.objects.filter(pk=job.pk).update(
            finished_at=timezone.now() - timedelta(minutes=minutes),
            started_at=timezone.now() - timedelta(minutes=minutes, seconds=5),
        )
    failed(None)
    base = live_server.url

    # Log in and land on the job list.
    log_in(page, base, "admin", "password", "/admin/jobstate/job/")
    assert page.locator("#result_list tbody tr").count() == 7
    assert page.locator("#result_list .js-badge-queued").count() == 1
    assert page.locator("#result_list .js-progress").count() == 7

    # Open the queued job and cancel it with a reason.
    page.click(f"#result_list a:has-text('{short(target.pk)}')")
    page.wait_for_url(re.compile(rf".*/jobstate/job/{target.pk}/change/"))
    assert page.locator("#js-operations .js-op-cancel").is_visible()
    page.click("#js-operations .js-op-cancel")
    page.fill("#id_reason", "customer withdrew the request")
    page.click("#js-confirm")
    page.wait_for_url(re.compile(rf".*/jobstate/job/{target.pk}/change/"))
    assert "Job cancelled." in page.locator("ul.messagelist").inner_text()
    rows = page.locator(".js-history tbody tr.has_original")
    assert rows.count() == 2  # enqueue, cancel
    last_row = rows.last
    assert "customer withdrew the request" in last_row.inner_text()
    assert "queued" in last_row.inner_text().lower() and "cancelled" in last_row.inner_text().lower()
    assert "admin" in last_row.inner_text()
    assert page.locator(".field-status_display .js-badge-cancelled").count() == 1
    event = JobEvent.objects.filter(job=target).latest("created_at", "id")
    assert (event.to_status, event.actor_id, event.actor_label) == (Status.CANCELLED, admin_user.pk, "admin")

    # The stuck page lists the job whose lease expired; requeue it in one click.
    orphan = queued(user, kind="test.limited", run_after=timezone.now() - timedelta(hours=1))
    page.goto(f"{base}/admin/jobstate/job/")
    page.click(".object-tools .js-link-stuck")
    row = page.locator(f"tr.js-stuck-row[data-job='{lost.pk}']")
    assert row.get_attribute("data-reason") == "lease_expired"
    row.locator("button.js-remedy-requeue").click()
    page.wait_for_url(re.compile(r".*/jobstate/job/stuck/$"))
    assert f"Job {short(lost.pk)} requeued." in page.locator("ul.messagelist").inner_text()
    assert page.locator(f"tr.js-stuck-row[data-job='{lost.pk}']").count() == 0
    assert Job.objects.get(pk=lost.pk).status == Status.QUEUED

    # A job queued long ago that no worker serves: cancel it in one click.
    row = page.locator(f"tr.js-stuck-row[data-job='{orphan.pk}']")
    assert row.get_attribute("data-reason") == "queued_no_worker"
    row.locator("button.js-remedy-cancel").click()
    page.wait_for_url(re.compile(r".*/jobstate/job/stuck/$"))
    assert f"Job {short(orphan.pk)} cancelled." in page.locator("ul.messagelist").inner_text()
    assert page.locator(f"tr.js-stuck-row[data-job='{orphan.pk}']").count() == 0
    assert Job.objects.get(pk=orphan.pk).status == Status.CANCELLED

    # The dashboard, from the admin index, draws its charts.
    page.goto(f"{base}/admin/")
    page.click("#content-main .app-jobstate a:text-is('Dashboard')")
    page.wait_for_url(re.compile(r".*/jobstate/job/dashboard/$"))
    charts = page.locator("svg.js-chart")
    assert charts.count() >= 4
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0
        assert box["x"] + box["width"] <= 1400, "a chart overflows the page"
    for selector in (
        "#js-panel-minute polygon.js-area",
        "#js-panel-hour rect.js-column",
        "#js-panel-status rect.js-bar",
    ):
        shape = page.locator(selector).first
        box = shape.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0, selector
