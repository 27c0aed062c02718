"""The admin's stylesheet (jobstate/static/jobstate/admin.css) read as text: every
status the model has gets a badge and a progress colour, so none shows as white
text on nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import jobstate
from jobstate.admin import display
from jobstate.admin.workers import STATE_CLASSES
from jobstate.states import Status

CSS = (Path(jobstate.__file__).parent / "static" / "jobstate" / "admin.css").read_text()


def rules() -> dict[str, str]:
    """Each rule's selector (one line, single spaces) -> its declarations."""
    text = re.sub(r"/\*.*?\*/", "", CSS, flags=re.S)
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
