"""MkDocs hooks (mkdocs.yml ``hooks:``) for the jobstate docs, and the writer of the
generated parts of the pages (``make docs-ref``: ``python docs/hooks.py --write``).

- Adds the pages listed in ``docs/nav-others.txt`` to the nav once their files exist.
- Generates text from the code, so it cannot drift from it. Each generated part is
  committed in its page between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``,
  so it reads in the repository too; ``--write`` rewrites those parts, ``--check`` (and
  ``tests/test_docs.py``) fails when one differs from what the code generates now, and the
  build regenerates them. The parts:
  ``settings`` (``jobstate.conf.DEFAULTS`` with their comments),
  ``commands`` (every ``jobstate`` management command's ``--help``),
  ``openapi`` (the operations of the OpenAPI schema; the build also writes the schema
  itself as ``reference/openapi.json``),
  ``services`` (each name in ``jobstate.services.__all__``: its signature and docstring),
  ``snippet FILE`` or ``snippet FILE:SECTION`` (a code block holding ``docs/snippets/FILE``,
  the file ``tests/newproject/run.sh`` runs, or its part between ``# --8<-- [start:SECTION]``
  and ``# --8<-- [end:SECTION]``).
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
from unittest import mock

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
    # The example project's settings, whatever the shell exports: the committed text is
    # the same from any machine.
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
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
        parser.color = False  # Python 3.14 colours the help on a terminal
        # Django's common options (--verbosity, --settings, ...) are the same for all.
        for action in parser._actions:
            if action.dest in COMMON_OPTIONS:
                action.help = argparse.SUPPRESS
        # argparse wraps the help to the terminal's width: 80 columns, on any terminal.
        with mock.patch.dict(os.environ, {"COLUMNS": "80"}):
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

# Each name of ``jobstate.services.__all__`` in one group: what an integrator calls first,
# then what the workers and the operators' tools (the reaper, the commands) call.
# (part heading, [(section heading, [names])])
SERVICE_GROUPS: list[tuple[str, list[tuple[str, list[str]]]]] = [
    (
        "What an integrator calls",
        [
            (
                "Queue jobs",
                [
                    "enqueue",
                    "get_or_enqueue",
                    "enqueue_many",
                    "enqueue_children",
                    "Child",
                    "checked_child",
                    "check_job",
                    "key_problem",
                    "DuplicateActiveKey",
                    "Actor",
                ],
            ),
            (
                "Act on jobs",
                [
                    "request_cancel",
                    "request_stop",
                    "retry",
                    "requeue",
                    "force_fail",
                    "force_cancel",
                    "operator_actions",
                ],
            ),
            ("Files", ["add_asset", "result_assets", "file_response", "safe_name"]),
        ],
    ),
    (
        "What workers and operators' tools call",
        [
            (
                "Claim and run",
                [
                    "claim",
                    "start",
                    "begin",
                    "Begun",
                    "NextClaim",
                    "heartbeat",
                    "Beat",
                    "extend_leases",
                    "report_progress",
                    "progress_fields",
                ],
            ),
            (
                "Outcomes",
                ["complete", "mark_partial", "fail", "fail_held", "cancel_now", "hand_back", "suspend"],
            ),
            (
                "Transitions, steps and locks",
                [
                    "move_step",
                    "lock_parent",
                    "parent_locked",
                    "all_transitions",
                    "all_step_transitions",
                    "allowed_transitions",
                ],
            ),
            ("Pause a kind", ["pause_kind", "resume_kind", "paused_kinds"]),
            (
                "Maintenance",
                ["requeue_expired", "ReapReport", "remove_orphan_files", "sweep_orphan_files", "OrphanSweep"],
            ),
        ],
    ),
]


def _annotation(annotation: Any) -> str:
    import inspect

    # The services' modules use ``from __future__ import annotations``: the text as written.
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _signature(name: str, obj: Any, *, prefix: str = "def ", indent: str = "") -> str:
    """``def name(a: int, *, b: str = "x") -> Job``, one parameter a line when that is long."""
    import inspect

    signature = inspect.signature(obj)
    params: list[str] = []
    previous = None
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and previous not in {param.KEYWORD_ONLY, param.VAR_POSITIONAL}:
            params.append("*")
        if previous is param.POSITIONAL_ONLY and param.kind is not param.POSITIONAL_ONLY:
            params.append("/")
        text = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "") + param.name
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
            if param.default is not param.empty:
                text += f" = {param.default!r}"
        elif param.default is not param.empty:
            text += f"={param.default!r}"
        params.append(text)
        previous = param.kind
    if previous is inspect.Parameter.POSITIONAL_ONLY:
        params.append("/")
    returns = ""
    if signature.return_annotation is not signature.empty:
        returns = f" -> {_annotation(signature.return_annotation)}"
    line = f"{indent}{prefix}{name}({', '.join(params)}){returns}"
    if len(line) <= 88:
        return line
    inner = "".join(f"{indent}    {param},\n" for param in params)
    return f"{indent}{prefix}{name}(\n{inner}{indent}){returns}"


def _docstring(obj: Any) -> str:
    import inspect

    # A class's own docstring only: not its base's, nor the one @dataclass makes up.
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
        return ""
    return inspect.cleandoc(doc)


def _class_reference(name: str, cls: Any) -> tuple[str, list[tuple[str, str]]]:
    """The class as Python (its fields, its public members' signatures), and the
    docstrings of those members."""
    import dataclasses
    import inspect

    bases = [base.__name__ for base in cls.__bases__ if base is not object]
    lines = []
    fields: set[str] = set()
    if dataclasses.is_dataclass(cls):
        frozen = cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        lines.append("@dataclass(frozen=True)" if frozen else "@dataclass")
    lines.append(f"class {name}({', '.join(bases)}):" if bases else f"class {name}:")
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            fields.add(field.name)
            if field.name.startswith("_"):
                continue
            text = f"    {field.name}: {_annotation(field.type)}"
            if field.default is not dataclasses.MISSING:
                text += f" = {field.default!r}"
            elif field.default_factory is not dataclasses.MISSING:
                text += f" = field(default_factory={field.default_factory.__name__})"
            lines.append(text)
    members = []
    for attribute, value in cls.__dict__.items():
        if attribute.startswith("_") or attribute in fields:
            continue
        if isinstance(value, property):
            decorator, function = "    @property\n", value.fget
        elif isinstance(value, classmethod | staticmethod):
            decorator, function = f"    @{type(value).__name__}\n", value.__func__
        elif inspect.isfunction(value):
            decorator, function = "", value
        else:
            continue
        if not members and len(lines) > 1 + dataclasses.is_dataclass(cls):
            lines.append("")  # the fields, a blank line, the methods
        lines.append(decorator + _signature(attribute, function, indent="    "))
        members.append((attribute, _docstring(function)))
    if len(lines) == 1 + dataclasses.is_dataclass(cls):
        lines.append("    ...")
    return "\n".join(lines), [(member, doc) for member, doc in members if doc]


def _service_reference(name: str, obj: Any) -> str:
    import inspect

    out = io.StringIO()
    out.write(f"#### `{name}`\n\n")
    if inspect.isclass(obj):
        code, members = _class_reference(name, obj)
    else:
        code, members = _signature(name, obj), []
    out.write(f"```python\n{code}\n```\n\n")
    if doc := _docstring(obj):
        out.write(f"{doc}\n\n")
    for member, doc in members:
        out.write(f"`{name}.{member}`: {doc}\n\n")
    return out.getvalue()


def services_reference() -> str:
    """Each name of ``jobstate.services.__all__``, in its group (``SERVICE_GROUPS``)."""
    _django()
    from jobstate import services

    grouped = [name for _, sections in SERVICE_GROUPS for _, names in sections for name in names]
    if sorted(grouped) != sorted(services.__all__):
        missing = sorted(set(services.__all__) - set(grouped))
        extra = sorted(set(grouped) - set(services.__all__))
        twice = sorted({name for name in grouped if grouped.count(name) > 1})
        raise ValueError(
            "docs/hooks.py SERVICE_GROUPS must name each of jobstate.services.__all__ once: "
            f"missing {missing}, not in __all__ {extra}, twice {twice}"
        )
    out = io.StringIO()
    for part, sections in SERVICE_GROUPS:
        out.write(f"## {part}\n\n")
        for section, names in sections:
            out.write(f"### {section}\n\n")
            for name in names:
                out.write(_service_reference(name, getattr(services, name)))
    return out.getvalue()


# --- snippets: the files the new-project test runs --------------------------------------------

SNIPPETS = DOCS / "snippets"
_SECTION = re.compile(r"^# --8<-- \[(start|end):(\w+)\]\n", re.M)
LANGUAGES = {".py": "python", ".sh": "sh"}


def snippet_text(spec: str) -> str:
    """``FILE`` (the whole file, without its section lines) or ``FILE:SECTION``."""
    file_name, _, section = spec.partition(":")
    text = (SNIPPETS / file_name).read_text()
    if section:
        start = f"# --8<-- [start:{section}]\n"
        end = f"# --8<-- [end:{section}]\n"
        if start not in text or end not in text:
            raise ValueError(f"docs/snippets/{file_name} has no section {section!r}")
        text = text.split(start, 1)[1].split(end, 1)[0]
    return _SECTION.sub("", text)


def snippet_reference(spec: str) -> str:
    language = LANGUAGES[Path(spec.partition(":")[0]).suffix]
    return f"```{language}\n{snippet_text(spec).rstrip()}\n```\n"


# --- the generated parts of the pages ----------------------------------------------------------

GENERATORS = {
    "settings": settings_reference,
    "commands": commands_reference,
    "openapi": openapi_reference,
    "services": services_reference,
}
END = "<!-- end generated -->"
# "<!-- generated: settings -->" or "<!-- generated: snippet settings.py:qcluster -->", then
# the text up to the end marker.
PART = re.compile(r"^<!-- generated: (\w+)(?: (\S+))? -->\n(.*?)^" + re.escape(END) + "$", re.M | re.S)
OPENED = re.compile(r"^<!-- generated: ", re.M)
CLOSED = re.compile(r"^" + re.escape(END) + "$", re.M)
COMMAND = "make docs-ref"


def generated(name: str, argument: str | None) -> str:
    if name == "snippet" and argument:
        return snippet_reference(argument)
    if name in GENERATORS and argument is None:
        return GENERATORS[name]()
    raise ValueError(f"unknown generated part: {name} {argument or ''}")


def fill(markdown: str, source: str = "page") -> str:
    """``markdown`` with each generated part as the code generates it now."""
    opened = len(OPENED.findall(markdown))
    if opened != len(CLOSED.findall(markdown)):
        raise ValueError(f"{source}: each '<!-- generated: NAME -->' needs its own line '{END}'")

    def replace(match: re.Match[str]) -> str:
        head = match.group(0).split("\n", 1)[0]
        text = generated(match.group(1), match.group(2)).strip("\n")
        return f"{head}\n\n{text}\n\n{END}"

    filled, count = PART.subn(replace, markdown)
    if count != opened:
        raise ValueError(f"{source}: a '<!-- generated: NAME -->' line is malformed")
    return filled


def pages() -> list[Path]:
    """The pages that hold a generated part."""
    return sorted(p for p in DOCS.rglob("*.md") if OPENED.search(p.read_text()))


def stale_pages(*, write: bool = False) -> list[Path]:
    """The pages whose generated parts differ from what the code generates now
    (rewritten with ``write``)."""
    stale = []
    for page in pages():
        text = page.read_text()
        filled = fill(text, str(page.relative_to(ROOT)))
        if filled != text:
            stale.append(page)
            if write:
                page.write_text(filled)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rewrite (or check) the generated parts of the docs.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite them (the default)")
    mode.add_argument("--check", action="store_true", help="exit 1, rewriting nothing, if one is stale")
    args = parser.parse_args(argv)
    stale = stale_pages(write=not args.check)
    for page in stale:
        done = "is stale" if args.check else "rewritten"
        print(f"{page.relative_to(ROOT)}: {done}")
    if stale and args.check:
        print(f"Run `{COMMAND}` (python docs/hooks.py --write) and commit the pages.")
        return 1
    return 0


# --- MkDocs hooks ---------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    # The site shows what the code generates now, even before `make docs-ref` was run.
    return fill(markdown, page.file.src_path)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(
        File.generated(config, "reference/openapi.json", content=json.dumps(openapi_schema(), indent=1))
    )
    return files


if __name__ == "__main__":
    sys.exit(main())
