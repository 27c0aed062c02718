"""Real-browser fixtures: headless Chromium (Debian's package) driven by Playwright.

Playwright's own browser download is never used: the browser is the system's
``chromium``. Without it the browser tests are skipped with a message, except in
CI (``CI=true``), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 15_000


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def find_chromium() -> str | None:
    """``JOBSTATE_CHROMIUM`` when set (and only it), else Debian's chromium."""
    chosen = os.environ.get("JOBSTATE_CHROMIUM")
    candidates = [chosen] if chosen else ["/usr/bin/chromium", "chromium", "chromium-browser"]
    for candidate in candidates:
        if path := shutil.which(candidate):
            return path
    return None


def unavailable(why: str) -> None:
    if in_ci():
        pytest.fail(f"Browser tests cannot run in CI: {why}", pytrace=False)
    pytest.skip(
        f"{why}; install it (apt-get install -y chromium; pip install playwright) to run browser tests"
    )


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    path = find_chromium()
    if path is None:
        unavailable("no chromium executable found")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed")
    # Playwright's sync API keeps an event loop in this thread; the test code's
    # own ORM calls are still plain synchronous calls.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def log_in(page: Any, base_url: str, username: str, password: str, next_url: str = "/admin/") -> None:
    page.goto(f"{base_url}/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}{next_url}*")
