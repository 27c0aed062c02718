"""The admin's stylesheet (jobstate/static/jobstate/admin.css) read as text: every
status the model has gets a badge and a progress colour, so none shows as white
text on nothing; on a phone the job page's tables are wrapped lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import jobstate
from jobstate.admin import display
from jobstate.admin.inlines import AssetInline, JobEventInline, JobStepInline
from jobstate.admin.workers import STATE_CLASSES
from jobstate.states import Status

CSS = (Path(jobstate.__file__).parent / "static" / "jobstate" / "admin.css").read_text()


def rules(css: str = CSS) -> dict[str, str]:
    """Each rule's selector (one line, single spaces) -> its declarations."""
    text = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    found: dict[str, str] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", text):
        for selector in selectors.split(","):
            key = " ".join(selector.split())
            found[key] = found.get(key, "") + body
    return found


def background(selector: str) -> str | None:
    match = re.search(r"background(?:-color)?\s*:\s*([^;]+)", rules().get(selector, ""))
    return match.group(1).strip() if match else None


@pytest.mark.parametrize("status", [s.value for s in Status])
def test_every_status_has_a_badge_in_its_chart_colour(status: str) -> None:
    assert background(f".js-badge-{status}") == display.STATUS_COLOURS[status]


@pytest.mark.parametrize("status", [s.value for s in Status])
def test_every_status_has_a_progress_colour(status: str) -> None:
    assert background(f".js-progress-{status} .js-progress-fill") is not None


def test_worker_states_use_status_badges() -> None:
    for state, badge in STATE_CLASSES.items():
        assert background(f".js-badge-{badge}") is not None, state


PHONE = "@media (max-width: 767px) {"


def phone_rules() -> dict[str, str]:
    """The rules inside the stylesheet's phone media queries (Django admin's breakpoint)."""
    blocks = []
    for start in [m.end() for m in re.finditer(re.escape(PHONE), CSS)]:
        depth, end = 1, start
        while depth:
            depth += {"{": 1, "}": -1}.get(CSS[end], 0)
            end += 1
        blocks.append(CSS[start : end - 1])
    return rules("\n".join(blocks))


@pytest.mark.parametrize("inline", [JobEventInline, JobStepInline, AssetInline])
def test_job_page_tables_are_wrapped_lines_on_a_phone(inline: type) -> None:
    """The steps and assets tables scrolled sideways at 360 px, as the history did."""
    (group,) = inline.classes
    page = "body.model-job.change-form"
    phone = phone_rules()
    assert "display: none" in phone.get(f"{page} .{group} table thead", "")
    assert "flex-wrap: wrap" in phone.get(f"{page} .inline-group .{group} tr.has_original", "")
    assert "display: block" in phone.get(f"{page} .inline-group .{group} tr.has_original td", "")
    assert "display: none" in phone.get(f"{page} .inline-group .{group} tr td.original", "")
