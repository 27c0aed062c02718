"""The admin's layout in a real browser: at a phone's width (390 px, 360 for a job's
steps and assets) the stuck page, the dashboard and a job page with its history, steps
and assets fit the screen, nothing (a Retry button, a history row's details, a
download link) out of sight to the right; the history's JSON details wrap between words."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate import services
from jobstate.models import JobStep
from jobstate.services import Actor, workers
from jobstate.services.steps import step_event
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.admin_support import ago, failed, processing, queued
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 390


def page_width(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth"))


def assert_on_screen(page: Any, selector: str, width: int = WIDTH) -> None:
    items = page.locator(selector)
    assert items.count() > 0, selector
    for i in range(items.count()):
        box = items.nth(i).bounding_box()
        assert box is not None and box["width"] > 0, selector
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (selector, box)


# The words of each element's text that the browser drew across two lines.
SPLIT_WORDS = """(selector) => {
  const split = [];
  for (const el of document.querySelectorAll(selector)) {
    const node = el.firstChild;
    for (const m of node.textContent.matchAll(/[A-Za-z]{4,}/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (tops.size > 1) split.push(m[0]);
    }
  }
  return split;
}"""


def retried_once(user: Any) -> Any:
    """A job whose first attempt failed and was requeued: its history has long details."""
    job = processing(user, parameters={"source": "upstream"})
    services.fail(
        job,
        job.lease_token,
        "upstream not ready (attempt 1), the service answered 503 Service Unavailable",
        error_type="ConnectionError",
        traceback="Traceback...\nConnectionError: upstream not ready",
        retry_delay=30,
    )
    return job


def test_history_details_wrap_between_words(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    job = retried_once(user)
    log_in(page, live_server.url, "admin", "password", f"/admin/jobstate/job/{job.pk}/change/")
    details = ".js-history td.field-details code.js-meta"
    for width in (1400, WIDTH):
        page.set_viewport_size({"width": width, "height": 900})
        lines = page.locator(details).evaluate_all("els => els.map(e => e.getClientRects().length)")
        assert max(lines) > 1, "the details fit on one line: nothing to check"
        assert page.evaluate(SPLIT_WORDS, details) == [], width


def test_phone_pages_fit_the_screen(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    retried = retried_once(user)
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


def test_job_steps_and_assets_fit_a_small_phone(
    page: Any, live_server: Any, admin_user: Any, user: Any
) -> None:
    """They were tables as wide as their seven columns, which scrolled sideways at 360 px."""
    job = processing(user)
    for position, name in enumerate(("extract", "transform-and-validate-every-row")):
        JobStep.objects.create(
            job=job,
            position=position,
            name=name,
            status="completed",
            attempts=2,
            cursor={"page": 812, "of": 1000, "last_key": "invoice-2026-10-000812"},
            output={"rows": 81200, "skipped": ["invoice-2026-10-000017", "invoice-2026-10-000512"]},
            started_at=job.started_at,
            finished_at=job.started_at,
        )
    services.add_asset(
        job,
        asset_type="report",
        name="monthly-invoice-reconciliation-report-2026-10-final.xlsx",
        content=b"x" * 2048,
        content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        token=job.lease_token,
    )
    width = 360
    page.set_viewport_size({"width": width, "height": 800})
    log_in(page, live_server.url, "admin", "password", f"/admin/jobstate/job/{job.pk}/change/")
    assert page_width(page) <= width
    for selector in (
        ".js-steps tr.has_original td.field-name",
        ".js-steps tr.has_original td.field-output_display code.js-meta",
        ".js-assets tr.has_original td.field-name",
        ".js-assets tr.has_original a.js-download",
    ):
        assert_on_screen(page, selector, width)
    for group in (".js-steps", ".js-assets"):
        scroll = page.locator(f"{group} table").evaluate("t => [t.scrollWidth, t.clientWidth]")
        assert scroll[0] <= scroll[1], (group, scroll)


def test_summary_values_line_up(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    job = retried_once(user)
    log_in(page, live_server.url, "admin", "password", f"/admin/jobstate/job/{job.pk}/change/")
    lefts = """(selector) => [...new Set([...document.querySelectorAll(selector)]
        .map((el) => Math.round(el.getBoundingClientRect().left)))]"""
    # Two label/value pairs a line at this width, one on a phone.
    for width, pairs in ((1400, 2), (WIDTH, 1)):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.locator(".js-summary .readonly").count() >= 10
        assert len(page.evaluate(lefts, ".js-summary .form-row label")) == pairs, width
        assert len(page.evaluate(lefts, ".js-summary .readonly")) == pairs, width


def test_job_ids_that_are_links_have_the_link_colour(
    page: Any, live_server: Any, admin_user: Any, user: Any
) -> None:
    failed(user)
    colours = """(selector) => [...document.querySelectorAll(selector)].map(
        (code) => [getComputedStyle(code).color, getComputedStyle(code.closest('a')).color])"""
    log_in(page, live_server.url, "admin", "password", "/admin/jobstate/job/")
    for url, selector in (
        ("/admin/jobstate/job/", "#result_list .field-short_id a code"),
        ("/admin/jobstate/job/stuck/", "tr.js-stuck-row td.js-cell-job a code"),
    ):
        page.goto(f"{live_server.url}{url}")
        found = page.evaluate(colours, selector)
        assert found, selector
        assert all(code == link for code, link in found), (selector, found)


def test_chart_gridlines_follow_the_theme(page: Any, live_server: Any, admin_user: Any) -> None:
    strokes = """() => [...document.querySelectorAll('svg.js-time-chart line.js-gridline')].map(
        (line) => getComputedStyle(line).stroke.match(/\\d+/g).slice(0, 3).map(Number))"""
    log_in(page, live_server.url, "admin", "password", "/admin/jobstate/job/dashboard/")
    # A light hairline on the light page; a dark one on the dark page, not bright lines.
    for scheme, bright in (("light", True), ("dark", False)):
        page.emulate_media(color_scheme=scheme)
        page.reload()
        found = page.evaluate(strokes)
        assert len(found) >= 4, scheme
        assert all((sum(rgb) / 3 > 200) == bright for rgb in found), (scheme, found)


def overflows(page: Any, width: int) -> list[str]:
    """What does not fit ``width``: the page itself, a cell or button past the window's
    edge, a box whose content scrolls sideways (a list's last column cut off)."""
    page.set_viewport_size({"width": width, "height": 900})
    found: list[str] = page.evaluate(
        """() => {
          const edge = document.documentElement.clientWidth + 0.5;
          const past = [...document.querySelectorAll('th, td, button, #header')]
            .filter((el) => el.getBoundingClientRect().width > 0 && el.getBoundingClientRect().right > edge)
            .map((el) => `${el.className || el.tagName}: ${el.textContent.trim().slice(0, 30)}`);
          const scrolled = [...document.querySelectorAll('.results, .js-scroll, .js-reason')]
            .filter((el) => el.scrollWidth > el.clientWidth + 1)
            .map((el) => `${el.className} scrolls ${el.scrollWidth} > ${el.clientWidth}`);
          return [...past, ...scrolled];
        }"""
    )
    if page_width(page) > width:
        found.insert(0, f"page {page_width(page)} px")
    return found


def test_desktop_pages_fit_their_width(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    """The stuck page at 1024 and 768 px was 1050 px wide, its Remedy buttons off-screen;
    at 1440 px the job list's created column (beside a "no worker for kind" flag) and
    the worker processes' last column were cut off."""
    orphan = queued(user, kind="test.limited", run_after=ago(minutes=24))
    for n in range(3):
        failed(user, error=f"step 'validate' failed: NonRetryable: validation failed ({n})")
    busy = processing(user)
    workers.beat("host-1:100:100", cluster="host-1:100", role="pusher")
    workers.beat("host-1:100:101", cluster="host-1:100", role="worker", job_id=busy.pk, finished=58)
    base = live_server.url
    log_in(page, base, "admin", "password", "/admin/jobstate/job/stuck/")
    assert page.locator(f"tr.js-stuck-row[data-job='{orphan.pk}']").count() == 1
    for width in (1440, 1024, 768):
        assert overflows(page, width) == [], width
        assert_on_screen(page, "tr.js-stuck-row button.js-remedy", width)
    page.goto(f"{base}/admin/jobstate/job/")
    assert "no worker for kind" in page.locator("#result_list").inner_text()
    assert overflows(page, 1440) == []
    page.goto(f"{base}/admin/jobstate/workerprocess/")
    assert overflows(page, 1440) == []
    # The deliveries list with its job and endpoint columns too.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/jobstate/events/v1")
    WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id="msg_0123456789abcdef0123456789abcdef",
        event="job.failed",
        job_id=busy.pk,
        status_code=503,
        error="HTTP 503: " + "upstream unavailable " * 10,
        duration_ms=1200,
    )
    page.goto(f"{base}/admin/jobstate/webhookdelivery/")
    assert page.locator("#result_list td.field-endpoint_column a").count() == 1
    assert overflows(page, 1440) == []


def test_paused_kinds_resume_buttons_fit_their_panel(page: Any, live_server: Any, admin_user: Any) -> None:
    """Beside the job charts (two panels a row from 1300 px) the paused kinds' table, with its
    full pause times in a column of their own, pushed its Resume buttons past the panel and
    the page at 1366 to 1440 px."""
    for kind in ("test.echo", "test.limited", "test.schema"):
        if kind != "test.schema":
            queued(kind=kind)
        services.pause_kind(kind, admin_user, "the mail API answers 503 since the deploy")
    log_in(page, live_server.url, "admin", "password", "/admin/jobstate/job/dashboard/")
    assert page.locator("#js-panel-paused button.js-resume-kind").count() == 3
    for width in (1440, 1366):
        assert overflows(page, width) == [], width
        panel = page.locator("#js-panel-paused").bounding_box()
        assert panel is not None
        for box in page.locator("#js-panel-paused button.js-resume-kind").evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().right)"
        ):
            assert box <= panel["x"] + panel["width"], width


def test_workflow_history_fits_a_laptop_screen(page: Any, live_server: Any, admin_user: Any) -> None:
    """A history with a worker's host:cluster:pid as actor made the page 1366 px wide at
    1280 px, the table past the content's edge (a workflow's step details, 1375)."""
    job = queued(kind="test.echo")
    worker = "ip-10-0-3-17.eu-west-1.compute.internal:48213:48230"
    services.start(job, worker, lease_seconds=600)
    job.refresh_from_db()
    services.fail(job, job.lease_token, "upstream not ready", error_type="ConnectionError", retry_delay=30)
    log_in(page, live_server.url, "admin", "password", f"/admin/jobstate/job/{job.pk}/change/")
    assert worker in page.locator(".js-history").inner_text()
    for width in (1366, 1280):
        page.set_viewport_size({"width": width, "height": 900})
        assert page_width(page) <= width, width


def test_history_fits_its_group_on_a_desktop(page: Any, live_server: Any, admin_user: Any, user: Any) -> None:
    """On Django 6 (its tabular cells in 1rem, the history's em min-widths a quarter wider)
    the history scrolled inside its group at every width, its details column cut off;
    a long token in the details (a path) widened the column to it."""
    job = processing(user)
    worker = Actor.worker("vm:17950:18000")
    for step in ("download", "process"):
        for before, after in (("pending", "running"), ("running", "completed")):
            meta = {"attempt": 1, "from": before, "step": step, "to": after}
            step_event(job.pk, job.status, "step_started", worker, metadata=meta)
    path = "/var/lib/jobstate/etl_work/0123456789abcdef0123456789abcdef/partitions/rows.parquet"
    step_event(job.pk, job.status, "step_undone", worker, "compensating", {"dir": path})
    log_in(page, live_server.url, "admin", "password", f"/admin/jobstate/job/{job.pk}/change/")
    fits = """() => {
      const group = document.querySelector('fieldset.js-history');
      const edge = group.getBoundingClientRect().right + 0.5;
      const table = group.querySelector('table');
      return [table.getBoundingClientRect().right <= edge,
              [...table.querySelectorAll('td.field-details')].every(
                (td) => td.getBoundingClientRect().right <= edge)];
    }"""
    for width in (1400, 1280):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate(fits) == [True, True], width
        assert path[:20] in page.locator(".js-history").inner_text()
