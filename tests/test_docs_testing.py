"""docs/howto/testing.md: its examples (docs/snippets/testing_*.py) run as the tests of
a project whose app, ``invoices``, holds the handlers and the task they test."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from django.test import SimpleTestCase

SNIPPETS = Path(__file__).resolve().parent.parent / "docs" / "snippets"


def load(name: str, file: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, SNIPPETS / file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if "invoices" not in sys.modules:
    sys.modules["invoices"] = types.ModuleType("invoices")
    load("invoices.jobs", "testing_jobs.py")
    load("invoices.tasks", "testing_tasks.py")


def collect(module: types.ModuleType) -> dict[str, Any]:
    """The module's tests (functions and TestCase classes), collected here as if written in this file."""
    return {
        name: value
        for name, value in vars(module).items()
        if getattr(value, "__module__", None) == module.__name__
        and (name.startswith("test_") or (isinstance(value, type) and issubclass(value, SimpleTestCase)))
    }


globals().update(collect(load("invoices.test_pytest", "testing_pytest.py")))
globals().update({"pytestmark": sys.modules["invoices.test_pytest"].pytestmark})
globals().update(collect(load("invoices.test_testcase", "testing_testcase.py")))


def test_the_page_shows_these_very_files():
    page = (SNIPPETS.parent / "howto" / "testing.md").read_text()
    for file in ("testing_jobs.py", "testing_tasks.py", "testing_pytest.py", "testing_testcase.py"):
        # Its code block is the file's copy (tests/test_docs.py checks the copies are current).
        assert f"<!-- generated: snippet {file} -->" in page, file
