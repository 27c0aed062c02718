"""Django's options (``--settings``, ``-v 2``, ``--traceback``, ...) after a subcommand
(``manage.py jobstate kinds --settings=...``), where Django users put them, as well as before it."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandParser

from tests.test_claim_concurrency import ROOT, database_env

# Each of Django's options with a value that is not its default, and the value parsed.
GIVEN = [
    (["--settings", "mysite.settings_jobs"], "settings", "mysite.settings_jobs"),
    (["--settings=mysite.settings_jobs"], "settings", "mysite.settings_jobs"),
    (["-v", "2"], "verbosity", 2),
    (["--verbosity=0"], "verbosity", 0),
    (["--pythonpath", "/srv/mysite"], "pythonpath", "/srv/mysite"),
    (["--traceback"], "traceback", True),
    (["--no-color"], "no_color", True),
    (["--force-color"], "force_color", True),
    (["--skip-checks"], "skip_checks", True),
]
DEFAULTS = {
    "settings": None,
    "verbosity": 1,
    "pythonpath": None,
    "traceback": False,
    "no_color": False,
    "force_color": False,
    "skip_checks": False,
}
# A subcommand of each command with subcommands, with its arguments.
SUBCOMMANDS = [
    ("jobstate", ["kinds"]),
    ("jobstate", ["enqueue", "test.echo", "--params", "{}"]),
    ("jobstate_workflow", ["state", "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43"]),
    ("jobstate_workflow", ["retry", "3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43", "--from", "b"]),
]


def parser_of(name: str) -> CommandParser:
    return load_command_class("jobstate", name).create_parser("manage.py", name)


def subparsers(parser: CommandParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


@pytest.mark.parametrize(("name", "sub"), SUBCOMMANDS)
@pytest.mark.parametrize(("option", "dest", "value"), GIVEN)
@pytest.mark.parametrize("where", ["before", "after"])
def test_django_s_options_before_or_after_the_subcommand(
    name: str, sub: list[str], option: list[str], dest: str, value: object, where: str
) -> None:
    # After it, they were "unrecognized arguments" (exit status 2).
    argv = [*option, *sub] if where == "before" else [*sub, *option]
    parsed = vars(parser_of(name).parse_args(argv))
    assert parsed == {**parsed, **DEFAULTS, dest: value}


@pytest.mark.parametrize(("name", "sub"), SUBCOMMANDS)
def test_left_out_they_have_django_s_defaults(name: str, sub: list[str]) -> None:
    parsed = vars(parser_of(name).parse_args(sub))
    assert parsed == {**parsed, **DEFAULTS}


def test_every_subcommand_of_every_command_takes_django_s_options_after_it() -> None:
    names = sorted(name for name, app in get_commands().items() if app == "jobstate")
    with_subcommands = []
    for name in names:
        parser = parser_of(name)
        common = {
            s for a in parser._actions if a.option_strings and a.dest != "help" for s in a.option_strings
        }
        for sub, subparser in subparsers(parser).items():
            with_subcommands.append(name)
            missing = common - set(subparser._option_string_actions)
            assert not missing, f"{name} {sub}: {sorted(missing)}"
    assert {"jobstate", "jobstate_workflow"} <= set(with_subcommands)


@pytest.mark.parametrize("where", ["before", "after"])
def test_force_color_before_or_after_the_subcommand_colours_the_output(where: str) -> None:
    # Given before it, a default of the subcommand's own would have set it back to False.
    args = ["--force-color", "kinds"] if where == "before" else ["kinds", "--force-color"]
    out = io.StringIO()
    call_command("jobstate", *args, stdout=out)
    assert "\x1b[" in out.getvalue()


def test_settings_after_the_subcommand_is_the_one_used() -> None:
    # manage.py reads --settings wherever it is, before the command's parser: the
    # subcommand's parser must only accept it. project.settings has no test.* kinds.
    env = {**database_env(), "DJANGO_SETTINGS_MODULE": "project.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "jobstate", "kinds", "--settings=project.test_settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "test.echo" in done.stdout
