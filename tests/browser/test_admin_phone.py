"""The admin at a phone's width (390 px): the stuck page, the dashboard and a job page
with its history fit the screen; nothing (a Retry button, a history row's details)
is out of sight to the right."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate import services
from jobstate.services import workers
from tests.admin_support import failed, processing
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 390


def page_width(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth"))


def assert_on_screen(page: Any, selector: str) -> None:
    items = page.locator(selector)
    assert items.count() > 0, selector
    for i in range(items.count()):
        box = items.nth(i).bounding_box()
        assert box is not None and box["width"] > 0, selector
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (selector, box)


def test_phone_pages_fit_the_screen(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    retried = processing(user, parameters={"source": "upstream"})
    services.fail(
        retried,
        retried.lease_token,
        "upstream not ready (attempt 1), the service answered 503 Service Unavailable",
        error_type="ConnectionError",
        traceback="Traceback...\nConnectionError: upstream not ready",
        retry_delay=30,
    )
    for n in range(2):
        failed(user, error=f"step 'validate' failed: NonRetryable: validation failed ({n})")
    busy = processing(user)
    workers.beat("host-1:100:100", cluster="host-1:100", role="pusher")
    workers.beat("host-1:100:101", cluster="host-1:100", role="worker", job_id=busy.pk, finished=58)
    base = live_server.url
    page.set_viewport_size({"width": WIDTH, "height": 844})
    log_in(page, base, "admin", "password", "/admin/jobstate/job/stuck/")

    assert page_width(page) <= WIDTH
    assert_on_screen(page, "tr.js-stuck-row button.js-remedy")
    assert_on_screen(page, "tr.js-stuck-row td.js-cell-why")

    page.goto(f"{base}/admin/jobstate/job/dashboard/")
    assert page_width(page) <= WIDTH
    assert_on_screen(page, ".js-panel")
    assert_on_screen(page, "#js-panel-workers .js-workers-table td:has(.js-badge)")

    page.goto(f"{base}/admin/jobstate/job/{retried.pk}/change/")
    assert page_width(page) <= WIDTH
    assert_on_screen(page, ".js-history tr.has_original td.field-when")
    assert_on_screen(page, ".js-history tr.has_original td.field-details code.js-meta")
    assert_on_screen(page, ".js-history tr.has_original td.field-reason_display p:not(:empty)")
