"""The README, the docs and the packaging metadata agree with the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jobstate

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SNIPPETS = {p.name: p.read_text() for p in (ROOT / "docs" / "snippets").iterdir()}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def test_readme_opens_with_the_two_commands_and_stays_a_landing_page():
    first = code_blocks(README, r"\w*")[0]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()] == ["make demo", "make test"]
    assert README.index("```") < README.index("\n## "), "the two commands come before any section"
    assert len(README.splitlines()) < 250


def test_readme_python_is_the_text_the_new_project_test_runs():
    blocks = code_blocks(README, "python")
    assert blocks
    for block in blocks:
        assert any(block in text for text in SNIPPETS.values()), f"not in docs/snippets/:\n{block}"


def test_every_system_check_id_is_documented():
    ids = set()
    for path in (ROOT / "jobstate").rglob("*.py"):
        ids |= set(re.findall(r"""id=["'](jobstate\.[A-Z]\d{3})["']""", path.read_text()))
    assert ids
    page = (ROOT / "docs" / "reference" / "checks.md").read_text()
    assert not [i for i in sorted(ids) if i not in page]


def test_check_hints_point_to_a_docs_page_that_exists():
    hints = set()
    for path in (ROOT / "jobstate").rglob("*.py"):
        text = path.read_text()
        assert "See the README" not in text, path
        hints |= set(re.findall(r"See (docs/[\w/.-]+\.md)", text))
    assert hints
    for hint in hints:
        assert (ROOT / hint).is_file(), hint


def test_one_version_source():
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "jobstate.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", jobstate.__version__)


def _requirements() -> dict[str, str]:
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name = re.match(r"[A-Za-z0-9_.\[\]-]+", line).group(0)
            found[name.lower()] = line.replace(" ", "")
    return found


def test_requirements_txt_pins_the_same_ranges_as_pyproject():
    requirements = _requirements()
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in ("postgres",):
        declared += PYPROJECT["project"]["optional-dependencies"][extra]
    for spec in declared:
        name = re.match(r"[A-Za-z0-9_.\[\]-]+", spec).group(0).lower()
        assert requirements.get(name) == spec.replace(" ", ""), f"requirements.txt: {spec}"
