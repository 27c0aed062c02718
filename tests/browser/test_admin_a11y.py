"""What a screen reader gets from jobstate's admin pages (Playwright's accessibility tree)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.admin_support import completed, failed, queued
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_jobs_by_kind_says_its_columns_and_counts(page: Any, live_server: Any, admin_user: Any) -> None:
    """Each bar was an image named "<kind> by status", its counts only in hover titles,
    and the table had no header row."""
    for _ in range(3):
        completed(kind="test.echo")
    failed(kind="test.echo")
    queued(kind="test.echo")
    log_in(page, live_server.url, "admin", "password", "/admin/jobstate/job/dashboard/")
    table = page.locator("#js-panel-kind table")
    tree = table.aria_snapshot()
    for header in ("Kind", "By status", "Jobs", "Pause"):
        assert f'columnheader "{header}"' in tree, tree
    assert 'cell "Queued: 1, Completed: 3, Failed: 1"' in tree, tree
    assert "img" not in tree, tree
    # The bar is drawn as before, the text takes no room.
    bar = table.locator(".js-stack").bounding_box()
    text = table.locator(".js-stack-text").bounding_box()
    assert bar is not None and bar["height"] == 14 and bar["width"] > 100
    assert text is not None and text["width"] <= 1 and text["height"] <= 1
