"""MkDocs hooks (mkdocs.yml ``hooks:``) for the jobstate docs.

- Adds the pages listed in ``docs/nav-others.txt`` to the nav once their files exist.
- Generates reference text from the code, so it cannot drift from it:
  ``<!-- generated: settings -->`` (``jobstate.conf.DEFAULTS`` with their comments),
  ``<!-- generated: commands -->`` (every ``jobstate`` management command's ``--help``),
  ``<!-- generated: openapi -->`` (the operations of the OpenAPI schema), and the
  schema itself as ``reference/openapi.json``;
  ``<!-- generated: services -->`` (one mkdocstrings block per name in
  ``jobstate.services.__all__``: the service API from its docstrings).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


# --- nav: pages other parts of the project write -------------------------------------


def on_config(config: Any) -> Any:
    for raw in (DOCS / "nav-others.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        section, title, path = (part.strip() for part in line.split("|"))
        if not (DOCS / path).is_file():
            continue
        for entry in config["nav"]:
            if isinstance(entry, dict) and section in entry:
                entry[section].append({title: path})
                break
        else:
            raise ValueError(f"nav-others.txt: no nav section {section!r}")
    return config


# --- Django, for the generated references ---------------------------------------------

_django_ready = False


def _django() -> None:
    global _django_ready
    if _django_ready:
        return
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    _django_ready = True


# --- settings ----------------------------------------------------------------------------


def _type_name(key: str) -> str:
    """The types ``manage.py check`` accepts for ``JOBSTATE[key]`` (``jobstate.conf.allowed_types``),
    e.g. ``int | float`` for a number of seconds, ``bool | None`` for ``TRACING``."""
    from jobstate import conf

    names = ("None" if t is type(None) else t.__name__ for t in conf.allowed_types(key))
    return " \\| ".join(names)  # "|" escaped: the cell is in a Markdown table


def settings_reference() -> str:
    """Group DEFAULTS by the comment block above them, in file order."""
    source = (ROOT / "jobstate" / "conf.py").read_text()
    tree = ast.parse(source)
    defaults = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and isinstance(node.value, ast.Dict)
        and "DEFAULTS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    )
    lines = source.splitlines()
    from jobstate import conf

    # (section title, comment, keys); a comment line such as "# Webhooks -----" opens a
    # section: a heading, not part of the text of the keys below it.
    groups: list[tuple[str, str, list[str]]] = []
    previous_end = defaults.lineno  # the line holding "DEFAULTS = {"
    for key_node in defaults.keys:
        assert isinstance(key_node, ast.Constant)
        comment = [
            line.strip().lstrip("#").strip()
            for line in lines[previous_end : key_node.lineno - 1]
            if line.strip().startswith("#")
        ]
        titles = [m.group(1) for line in comment if (m := re.fullmatch(r"(\w[\w ]*?)\s*-{3,}", line))]
        comment = [line for line in comment if not re.fullmatch(r"(\w[\w ]*?)\s*-{3,}", line)]
        if comment or titles or not groups:
            groups.append((" ".join(titles), " ".join(comment), []))
        groups[-1][2].append(key_node.value)
        value_node = defaults.values[defaults.keys.index(key_node)]
        previous_end = value_node.end_lineno or key_node.lineno

    out = io.StringIO()
    for title, text, keys in groups:
        if title:
            out.write(f"## {title}\n\n")
        if text:
            out.write(f"{text}\n\n")
        out.write("| key | type | default |\n|---|---|---|\n")
        for key in keys:
            value = conf.DEFAULTS[key]
            out.write(f"| `{key}` | {_type_name(key)} | `{value!r}` |\n")
        out.write("\n")
    return out.getvalue()


# --- management commands -------------------------------------------------------------------


COMMON_OPTIONS = {
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def commands_reference() -> str:
    _django()
    from django.core.management import get_commands, load_command_class

    out = io.StringIO()
    for name, app in sorted(get_commands().items()):
        if app != "jobstate":
            continue
        parser = load_command_class(app, name).create_parser("manage.py", name)
        # Django's common options (--verbosity, --settings, ...) are the same for all.
        for action in parser._actions:
            if action.dest in COMMON_OPTIONS:
                action.help = argparse.SUPPRESS
        help_text = parser.format_help()
        out.write(f"## {name}\n\n```text\n{help_text.rstrip()}\n```\n\n")
    return out.getvalue()


# --- REST API ---------------------------------------------------------------------------------

_schema: dict[str, Any] | None = None


def openapi_schema() -> dict[str, Any]:
    global _schema
    if _schema is None:
        _django()
        from drf_spectacular.generators import SchemaGenerator
        from drf_spectacular.renderers import OpenApiJsonRenderer

        schema = SchemaGenerator().get_schema(request=None, public=True)
        _schema = json.loads(OpenApiJsonRenderer().render(schema, renderer_context={}))
    return _schema


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def openapi_reference() -> str:
    schema = openapi_schema()
    out = io.StringIO()
    out.write("| method | path | operation | responses |\n|---|---|---|---|\n")
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            summary = _cell(
                op.get("summary") or op.get("description", "").split("\n")[0] or op["operationId"]
            )
            codes = ", ".join(sorted(op.get("responses", {})))
            out.write(f"| {method.upper()} | `{path}` | {summary} | {codes} |\n")
    return out.getvalue()


# --- service API -------------------------------------------------------------------------------


def service_paths() -> list[str]:
    """Where each name of ``jobstate.services.__all__`` is defined, in ``__all__`` order.

    mkdocstrings is given these paths rather than ``jobstate.services`` whole: griffe
    reads ``jobstate.services.enqueue`` as the submodule of that name, which the
    package's ``from jobstate.services.enqueue import enqueue`` shadows at run time.
    """
    _django()
    from jobstate import services

    paths = []
    for name in services.__all__:
        obj = getattr(services, name)
        paths.append(f"{obj.__module__}.{obj.__qualname__}")
    return paths


def services_reference() -> str:
    return "".join(f"::: {path}\n\n" for path in service_paths())


GENERATORS = {
    "settings": settings_reference,
    "commands": commands_reference,
    "openapi": openapi_reference,
    "services": services_reference,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        return GENERATORS[match.group(1)]()

    # The marker, and the note under it for readers of the Markdown source.
    marker = r"<!-- generated: (\w+) -->(?:\n\*In the repository this part is empty[^\n]*\*)?"
    return re.sub(marker, replace, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(
        File.generated(config, "reference/openapi.json", content=json.dumps(openapi_schema(), indent=1))
    )
    return files
