"""The README, the docs and the packaging metadata agree with the code."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest
from django.core.checks import CheckMessage, run_checks
from django.test import override_settings

import jobstate
from jobstate import conf, services, settings_checks
from jobstate.worker.checks import BROKER, sqlite_options_errors, sqlite_warnings

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


def quick_start() -> str:
    return README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_readme_quick_start_configures_the_worker_and_says_how_to_install():
    """A reader of the README alone gets a qcluster that runs jobs (no "No module named
    'redis'"), and can install jobstate while it is not on PyPI."""
    section = quick_start()
    (block,) = [b for b in code_blocks(section, "python") if "Q_CLUSTER = {" in b]
    q_cluster = ast.literal_eval(block.split("Q_CLUSTER = ", 1)[1])
    assert q_cluster["broker_class"] == BROKER
    with override_settings(Q_CLUSTER=q_cluster):
        assert not [m.id for m in run_checks(tags=["jobstate"]) if m.id.startswith("jobstate.W")]
    assert section.index("Q_CLUSTER = {") < section.index("manage.py qcluster")
    # On SQLite (startproject's default) the Quick start's settings alone printed
    # jobstate.W009 at every manage.py command: its OPTIONS were only in the tutorial.
    (sqlite,) = [b for b in code_blocks(section, "python") if 'DATABASES["default"]["OPTIONS"]' in b]
    project = {"DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}}
    exec(sqlite, project)
    assert not sqlite_warnings(project["DATABASES"]["default"])
    install = code_blocks(section, "sh")[0]
    assert "python -m pip install ./jobstate-src " in install  # the clone's root, not its package
    assert "dist/django_jobstate-*.whl" in install
    assert "django-jobstate" not in install, "not on PyPI yet"


def test_readme_python_is_the_text_the_new_project_test_runs():
    blocks = code_blocks(README, "python")
    assert blocks
    for block in blocks:
        assert any(block in text for text in SNIPPETS.values()), f"not in docs/snippets/:\n{block}"


CHECKS_PAGE = "docs/reference/checks.md"


def check_ids_in_code() -> set[str]:
    ids = set()
    for path in (ROOT / "jobstate").rglob("*.py"):
        ids |= set(re.findall(r"""id=["'](jobstate\.[A-Z]\d{3})["']""", path.read_text()))
    return ids


def test_every_system_check_id_is_documented():
    ids = check_ids_in_code()
    assert {"jobstate.E001", "jobstate.E902", "jobstate.W001", "jobstate.W009"} <= ids
    page = (ROOT / CHECKS_PAGE).read_text()
    # Each id has its own row in one of the page's tables.
    assert not [i for i in sorted(ids) if not re.search(rf"^\| {re.escape(i)} \|", page, flags=re.M)]


def test_the_checks_page_names_every_key_with_a_least_value():
    page = (ROOT / CHECKS_PAGE).read_text()
    (row,) = re.findall(r"^\| jobstate\.E005 \|.*$", page, flags=re.M)
    assert not [key for key in conf.MINIMUM if f"`{key}`" not in row]


def test_the_checks_page_names_every_key_with_a_most_value():
    page = (ROOT / CHECKS_PAGE).read_text()
    (row,) = re.findall(r"^\| jobstate\.E012 \|.*$", page, flags=re.M)
    assert not [key for key in conf.MAXIMUM if f"`{key}`" not in row]
    assert f" {conf.MAX_ATTEMPTS_LIMIT}" in row


def test_the_checks_page_names_every_fraction_and_every_backoff_cap():
    page = (ROOT / CHECKS_PAGE).read_text()
    (fractions,) = re.findall(r"^\| jobstate\.E010 \|.*$", page, flags=re.M)
    (caps,) = re.findall(r"^\| jobstate\.E011 \|.*$", page, flags=re.M)
    assert not [key for key in conf.FRACTIONS if f"`{key}`" not in fractions]
    assert not [key for pair in conf.CAPS.items() for key in pair if f"`{key}`" not in caps]


def test_the_checks_page_names_every_number_of_seconds_that_may_be_0():
    page = (ROOT / CHECKS_PAGE).read_text()
    (row,) = re.findall(r"^\| jobstate\.E009 \|.*$", page, flags=re.M)
    stuck = "the `STUCK_*_SECONDS` thresholds" in row
    missing = [
        k for k in conf.SECONDS_FROM_ZERO if f"`{k}`" not in row and not (stuck and k.startswith("STUCK_"))
    ]
    assert not missing


def every_check_message(temp_handler: Any) -> list[CheckMessage]:
    """Settings that set off every system check the code defines."""
    temp_handler("docs.long", timeout=900)  # a hard limit above the cluster timeout below (W005)
    found: list[CheckMessage] = []
    # No broker_class (W001, W005), timeout not below retry (W002), no max_attempts (W003)
    # or ack_failures (W004), cached (W006), sync (W007), a heartbeat over half the lease (W008),
    # a prune budget over half the timeout (W014), no catch_up False (W015), a cluster_name
    # other than the name (W016).
    with override_settings(
        Q_CLUSTER={"timeout": 60, "retry": 60, "cached": 60, "sync": True, "cluster_name": "other"},
        JOBSTATE={"LEASE_SECONDS": 20, "HEARTBEAT_SECONDS": 15},
    ):
        found += run_checks(tags=["jobstate"])
    found += sqlite_warnings({"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {}})  # W009
    found += sqlite_options_errors("default", {"OPTIONS": {"timeout": 30}}, "postgresql")  # E013
    found += settings_checks.problems([])  # E001
    found += settings_checks.problems({"LEASE_SECOND": 60, "RETENTION_DAYS": "thirty"})  # E002, E003
    found += settings_checks.problems({"PREFETCH_SECONDS": 0.5})  # W010
    found += settings_checks.problems({"PRUNE_BATCH": 0, "METRICS_ACCESS": "public"})  # E005, E006
    found += settings_checks.problems({"WEBHOOK_TIMEOUT": 0})  # E009
    found += settings_checks.problems({"RETRY_JITTER": 25, "RETRY_BACKOFF_MAX": 1})  # E010, E011
    found += settings_checks.problems({"DEFAULT_MAX_ATTEMPTS": 1001})  # E012
    with override_settings(JOBSTATE={"STORAGE": "nowhere"}):
        found += settings_checks.check_storage()  # E004
    with override_settings(MEDIA_ROOT=""):
        found += settings_checks.check_storage()  # W011
    with override_settings(JOBSTATE={"METRICS_ACCESS": "token"}):
        found += run_checks(tags=["jobstate"])  # E007
    with override_settings(JOBSTATE={"INTERRUPT_GRACE_SECONDS": 55}):
        found += run_checks(tags=["jobstate"])  # W017: 55 + 10 >= 30 + 30
    with override_settings(JOBSTATE={"TRACING": True}), mock.patch.dict(sys.modules, {"opentelemetry": None}):
        found += run_checks(tags=["jobstate"])  # W012
    from jobstate.tasks.checks import options_problems

    found += options_problems("default", {"MAX_ATTEMPTS": 0, "RETRIES": 3, "MODULES": "x"})  # E902-E904
    from jobstate.worker.checks import check_django_q

    with mock.patch("jobstate.worker.checks.apps.is_installed", return_value=False):
        found += check_django_q()  # W013
    from jobstate.api.checks import check_api_apps

    with mock.patch("jobstate.api.checks.apps.is_installed", return_value=False):
        found += check_api_apps()  # E008 (the test URLconf mounts the API)
    return found


def test_every_check_hint_names_the_checks_page(temp_handler):
    messages = [m for m in every_check_message(temp_handler) if str(m.id).startswith("jobstate.")]
    # Every id the code defines is set off above, so none goes unchecked.
    assert {m.id for m in messages} == check_ids_in_code()
    assert (ROOT / CHECKS_PAGE).is_file()
    assert not [m.id for m in messages if f"See {CHECKS_PAGE}" not in (m.hint or "")]


def test_w008_hint_agrees_with_the_check_and_the_docs():
    # The check warns above half the lease; so must the hint and the page.
    with override_settings(JOBSTATE={"LEASE_SECONDS": 20, "HEARTBEAT_SECONDS": 10}):
        assert not [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.W008"]
    with override_settings(JOBSTATE={"LEASE_SECONDS": 20, "HEARTBEAT_SECONDS": 10.5}):
        (warning,) = [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.W008"]
    assert "at most half of LEASE_SECONDS" in warning.hint
    assert (
        "| jobstate.W008 | `HEARTBEAT_SECONDS` > half of `LEASE_SECONDS` |"
        in (ROOT / CHECKS_PAGE).read_text()
    )


def test_w017_warns_once_giving_up_a_deaf_handler_comes_after_django_q_s_hard_limit():
    def w017(**jobstate: float) -> list[Any]:
        with override_settings(JOBSTATE=jobstate):
            return [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.W017"]

    assert not w017()  # the defaults: 30 + 10 < 30 + 30
    assert not w017(INTERRUPT_GRACE_SECONDS=49.5)
    assert w017(INTERRUPT_GRACE_SECONDS=50)
    assert w017(CANCEL_GRACE_SECONDS=5, HARD_KILL_MARGIN_SECONDS=5, INTERRUPT_GRACE_SECONDS=5)


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


def test_the_example_project_is_type_checked_as_strictly_as_the_package():
    # The docs point users at project/ (its settings and handlers) to copy from; it was
    # outside mypy's files and held errors the strict configuration reports.
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["strict"] is True and {"jobstate", "project"} <= set(mypy["files"])
    relaxed = [str(override["module"]) for override in mypy.get("overrides", [])]
    assert not [modules for modules in relaxed if "project" in modules]


# --- the generated references (docs/hooks.py) ----------------------------------------------


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("jobstate_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # pytest-django has set Django up already, with the test settings and environment.
    monkeypatch.setattr(module, "_django_ready", True)
    return module


def test_settings_reference_gives_each_key_the_types_the_check_accepts(hooks):
    reference = hooks.settings_reference()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \| `.*` \|$", reference, flags=re.M))
    assert rows.keys() == conf.DEFAULTS.keys()
    assert rows["TRACING"] == "bool \\| None"
    assert rows["PREFETCH"] == "int \\| None"
    assert rows["RETENTION_DAYS"] == "int \\| float \\| None"
    assert rows["LEASE_SECONDS"] == "int \\| float"
    assert rows["WEBHOOK_ALLOW_PRIVATE"] == "bool"
    assert rows["STORAGE"] == "str"
    for key, cell in rows.items():
        expected = ["None" if t is type(None) else t.__name__ for t in conf.allowed_types(key)]
        assert [name.strip() for name in cell.split("\\|")] == expected, key


def test_settings_reference_describes_each_key_by_its_own_comment(hooks):
    # DEFAULT_MAX_ATTEMPTS sat under "Seconds between background heartbeats", and the
    # "# Webhooks -----" section lines were printed as part of a key's description.
    reference = hooks.settings_reference()
    table = r"\| key \| type \| default \|\n\|---\|---\|---\|\n((?:\|.*\n)+)"
    texts = re.findall(r"^(?!\|)(.+)\n\n" + table, reference, re.M)
    described = {key: text for text, rows in texts for key in re.findall(r"^\| `(\w+)`", rows, re.M)}
    assert described.keys() == conf.DEFAULTS.keys()
    assert "max_attempts" in described["DEFAULT_MAX_ATTEMPTS"], described["DEFAULT_MAX_ATTEMPTS"]
    assert not any("---" in text for text in described.values())
    for section in ("Webhooks", "Metrics", "Tracing"):
        assert f"\n## {section}\n" in reference


def test_service_reference_documents_every_public_name_once_integrators_first(hooks):
    """reference/services.md is plain Markdown (it reads in the repository): each name in
    __all__ once, with its signature, what an integrator calls before what workers call."""
    reference = hooks.services_reference()
    headings = re.findall(r"^#### `(\w+)`$", reference, flags=re.M)
    assert sorted(headings) == sorted(services.__all__)
    workers = reference.index("\n## What workers and operators' tools call\n")
    assert reference.startswith("## What an integrator calls\n")
    for name in ("enqueue", "get_or_enqueue", "request_cancel", "retry", "add_asset"):
        assert reference.index(f"#### `{name}`") < workers, name
    for name in ("claim", "begin", "hand_back", "lock_parent", "requeue_expired"):
        assert reference.index(f"#### `{name}`") > workers, name
    assert "def claim(\n    worker_id: str,\n" in reference
    assert "@dataclass(frozen=True)\nclass Child:\n    kind: str\n" in reference
    assert "_checked" not in reference, "no private field"


def test_service_reference_refuses_a_name_left_out_of_its_groups(hooks, monkeypatch):
    monkeypatch.setattr(services, "__all__", [*services.__all__, "DEFAULT_DB_ALIAS"])
    with pytest.raises(ValueError, match=r"missing \['DEFAULT_DB_ALIAS'\]"):
        hooks.services_reference()


def test_the_committed_generated_parts_are_what_the_code_generates_now():
    """The references and the copies of docs/snippets/ read in the repository (GitHub, an
    editor) as they do on the site: a change to the code without `make docs-ref` fails here."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "hooks.py"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_check_names_the_stale_page_and_the_command_and_write_rewrites_it(
    hooks, monkeypatch, tmp_path, capsys
):
    (tmp_path / "docs" / "snippets").mkdir(parents=True)
    snippet = "# --8<-- [start:x]\nA = 1\n# --8<-- [end:x]\nB = 2\n"
    (tmp_path / "docs" / "snippets" / "a.py").write_text(snippet)
    page = tmp_path / "docs" / "page.md"
    text = "# Page\n\n<!-- generated: snippet a.py -->\nold\n<!-- end generated -->\n\nafter\n"
    page.write_text(text)
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    monkeypatch.setattr(hooks, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(hooks, "SNIPPETS", tmp_path / "docs" / "snippets")

    assert hooks.main(["--check"]) == 1
    assert capsys.readouterr().out == (
        "docs/page.md: is stale\nRun `make docs-ref` (python docs/hooks.py --write) and commit the pages.\n"
    )
    assert page.read_text() == text
    assert hooks.main(["--write"]) == 0
    expected = "<!-- generated: snippet a.py -->\n\n```python\nA = 1\nB = 2\n```\n\n<!-- end generated -->\n"
    assert page.read_text() == f"# Page\n\n{expected}\nafter\n"
    capsys.readouterr()
    assert hooks.main(["--check"]) == 0
    assert capsys.readouterr().out == ""
    assert hooks.snippet_reference("a.py:x") == "```python\nA = 1\n```\n"


def test_fill_refuses_a_generated_part_without_its_end(hooks):
    with pytest.raises(ValueError, match="needs its own line"):
        hooks.fill("<!-- generated: settings -->\ntext\n", "page.md")


SNIPPET_PAGES = ["docs/tutorial.md", "docs/howto/add-to-project.md", "docs/explanation/workers.md"]


@pytest.mark.parametrize("path", SNIPPET_PAGES)
def test_the_pages_code_blocks_are_the_files_the_new_project_test_runs(hooks, path):
    """The code shows in the raw Markdown (no bare `--8<--` include line), and each copy is
    the text of the file in docs/snippets/ that tests/newproject/run.sh runs."""
    page = (ROOT / path).read_text()
    assert not re.search(r"^-+8<-+ ", page, flags=re.M)
    parts = re.findall(
        r"^<!-- generated: snippet (\S+) -->\n\n```(\w+)\n(.*?)^```\n\n<!-- end generated -->$",
        page,
        flags=re.M | re.S,
    )
    assert len(parts) == page.count("<!-- generated: snippet ")
    for spec, _language, code in parts:
        file_name, _, section = spec.partition(":")
        text = SNIPPETS[file_name]
        if section:
            text = text.split(f"# --8<-- [start:{section}]\n")[1].split(f"# --8<-- [end:{section}]\n")[0]
        assert code == re.sub(r"^# --8<-- \[(start|end):\w+\]\n", "", text, flags=re.M), spec
    if path == "docs/tutorial.md":
        run_sh = (ROOT / "tests" / "newproject" / "run.sh").read_text()
        used = set(re.findall(r'\$SNIPPETS/([\w.]+)"', run_sh))
        assert used == {"install.sh", "settings.py", "urls.py", "jobs.py", "setup.sh"}
        assert used <= {spec for spec, _, _ in parts}


def test_no_page_includes_a_file_the_site_alone_would_show():
    # pymdownx.snippets is gone from mkdocs.yml: an include line would print as text.
    for path in (ROOT / "docs").rglob("*.md"):
        assert not re.search(r'^\s*-+8<-+ "', path.read_text(), flags=re.M), path


def test_deploy_page_names_the_enums_that_silence_drf_spectacular_deploy_check(monkeypatch):
    """``check --deploy`` in a new project warns (drf_spectacular.W001) about jobstate's two
    ``status`` enums until SPECTACULAR_SETTINGS names them as the deploy page shows."""
    from drf_spectacular.checks import schema_check
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.plumbing import _load_enum_name_overrides
    from drf_spectacular.settings import spectacular_settings

    from jobstate.api.schema import ENUM_NAMES

    page = (ROOT / "docs" / "howto" / "deploy.md").read_text()
    blocks = re.findall(r"^ *```python\n(.*?)^ *```$", page, flags=re.M | re.S)
    (block,) = [b for b in blocks if "ENUM_NAME" in b]
    documented = ast.literal_eval(block.split("SPECTACULAR_SETTINGS = ", 1)[1].strip())
    assert documented["ENUM_NAME_OVERRIDES"] == ENUM_NAMES

    def warnings() -> list[str]:
        GENERATOR_STATS.reset()  # it keeps every warning it gave
        _load_enum_name_overrides.cache_clear()  # and the overrides it read first
        try:
            return [m.id for m in schema_check(None) if m.id == "drf_spectacular.W001"]
        finally:
            GENERATOR_STATS.reset()
            _load_enum_name_overrides.cache_clear()

    monkeypatch.setattr(spectacular_settings, "ENUM_NAME_OVERRIDES", {})
    assert warnings(), "the page explains a warning the check gives"
    monkeypatch.setattr(spectacular_settings, "ENUM_NAME_OVERRIDES", documented["ENUM_NAME_OVERRIDES"])
    assert not warnings()


def test_the_rest_api_table_describes_each_endpoint_once():
    # The retry and requeue rows were there twice, the older of each saying less
    # (no from_step) or what is no longer so (requeued "now").
    page = (ROOT / "docs" / "reference" / "rest-api.md").read_text()
    table = page.split("| Method and path | What it does |", 1)[1].split("\n\n", 1)[0]
    named = [
        operation
        for row in table.splitlines()[2:]
        for operation in re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /api/[^`]*)`", row.split(" | ", 1)[0])
    ]
    assert "POST /api/jobs/{id}/retry/" in named
    assert len(named) == len(set(named)), sorted(n for n in named if named.count(n) > 1)


def test_the_admin_buttons_table_describes_each_operation_once():
    # Force cancel and Retry were there twice, the older Force cancel row naming
    # cancel_now, not the force_cancel the button calls.
    from jobstate.admin.actions import OPERATIONS

    page = (ROOT / "docs" / "reference" / "admin.md").read_text()
    table = page.split("| Button | Shown when | Calls | Permission |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in table.strip().splitlines()[1:]]
    assert [(row[0], row[-1]) for row in rows] == [
        (f"{op.label}…", f"`jobstate.{op.permission}`") for op in OPERATIONS.values()
    ]
    assert "`services.force_cancel`" in dict((row[0], row[2]) for row in rows)["Force cancel…"]
