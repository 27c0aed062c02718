"""The import structure of jobstate (issue 11): layers, and no import cycle."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _graph() -> grimp.ImportGraph:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return grimp.build_graph("jobstate", cache_dir=None, exclude_type_checking_imports=True)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), every import
    counted (module level and inside functions) but those under TYPE_CHECKING."""
    modules = sorted(m for m in graph.modules if not m.startswith("jobstate.migrations"))
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & set(modules) - {m}) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_jobstate_modules():
    assert cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for name in ("jobstate", "jobstate.a", "jobstate.b", "jobstate.c"):
        graph.add_module(name)
    graph.add_import(importer="jobstate.a", imported="jobstate.b")
    graph.add_import(importer="jobstate.b", imported="jobstate.c")
    graph.add_import(importer="jobstate.c", imported="jobstate.a")
    assert cycles(graph) == [["jobstate.a", "jobstate.b", "jobstate.c"]]


def test_import_contracts_hold(monkeypatch: pytest.MonkeyPatch):
    """The layers and "core imports no workflows/worker/api/admin" (.importlinter)."""
    from importlinter import cli

    monkeypatch.chdir(ROOT)
    # lint_imports configures logging with disable_existing_loggers: "jobstate" and
    # its children would stay disabled for the tests that run after this one in
    # the same process (their caplog assertions then saw no record).
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    disabled = {logger: logger.disabled for logger in loggers}
    try:
        status = cli.lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True)
    finally:
        for logger, was in disabled.items():
            logger.disabled = was
    assert status == cli.EXIT_STATUS_SUCCESS
    assert not logging.getLogger("jobstate").disabled


def test_the_contracts_fail_when_the_core_imports_workflows(tmp_path: Path):
    """The contracts can fail: a copy of jobstate whose services import workflows is refused."""
    import shutil
    import subprocess

    shutil.copytree(ROOT / "jobstate", tmp_path / "jobstate", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    control = tmp_path / "jobstate" / "services" / "control.py"
    control.write_text(control.read_text() + "\nimport jobstate.workflows  # noqa: E402\n")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0, run.stdout
    assert "jobstate.services.control -> jobstate.workflows" in run.stdout, run.stdout
    assert "BROKEN" in run.stdout


def test_no_import_cycle_even_through_type_only_imports():
    """Imports under TYPE_CHECKING make no cycle either: a module that needs another's
    type for its annotations only still sits below it (the workflows' step context,
    fan-out and compensation see a run through ``definition.RunState``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("jobstate", cache_dir=None, exclude_type_checking_imports=False)
    assert cycles(graph) == []
