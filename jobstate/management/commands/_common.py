"""Shared by the jobstate commands: find a job by id, say what went wrong in one line,
stop quietly when the reader of the output leaves."""

from __future__ import annotations

import argparse
import contextlib
import copy
import getpass
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, OperationalError, ProgrammingError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations import Migration
from django.db.migrations.executor import MigrationExecutor

from jobstate import services
from jobstate.models import Job

# A shell's status for a process that SIGPIPE ended (128 + 13), as `git log | head` leaves.
BROKEN_PIPE_STATUS = 141

# Characters per write of a long text: at most 4,096 bytes in UTF-8, Linux's PIPE_BUF, so a
# write to a pipe is all or nothing.
_WRITE_CHARS = 1024

_T = TypeVar("_T")


class JobstateCommand(BaseCommand):
    """A jobstate command: run before ``migrate``, or before the migrations of a new release
    are applied, it says to run that first in one line (a CommandError, exit status 1),
    naming the migrations not applied, instead of a traceback."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except (OperationalError, ProgrammingError) as exc:  # SQLite's, PostgreSQL's "no such table"
            using = options.get("database")
            found = _missing_table(exc, using)
            if found is not None:
                table, alias = found
                lacking = f"The database has no {table} table"
            else:
                column = missing_column(exc, using)
                if column is None:  # another error: as it was
                    raise
                table, name, alias = column
                lacking = f"The database's {table} table has no {name} column"
            raise CommandError(f"{lacking}: {_migrate_advice(alias)}") from exc


def missing_table(exc: DatabaseError, using: str | None = None) -> str | None:
    """The first table of an installed model that ``exc`` names and that the database it is
    read from (``using``, else the router's) does not have; None when there is none, or the
    database cannot tell. Named in the error and missing, it is the cause, not a lock or a
    lost connection that happened while another table was missing."""
    found = _missing_table(exc, using)
    return None if found is None else found[0]


def _missing_table(exc: DatabaseError, using: str | None) -> tuple[str, str] | None:
    """``missing_table``'s table and the alias of the database that lacks it."""
    text = str(exc)
    named = []  # (where the error names it, table, database)
    for model in apps.get_models():
        table = model._meta.db_table
        found = re.search(rf"\b{re.escape(table)}\b", text)  # not jobstate_job in jobstate_jobevent
        if found:
            named.append((found.start(), table, using or router.db_for_read(model)))
    present: dict[str, set[str]] = {}
    for _, table, alias in sorted(named):
        if alias not in present:
            tables = _table_names(alias)
            if tables is None:
                return None
            present[alias] = tables
        if connections[alias].introspection.identifier_converter(table) not in present[alias]:
            return table, alias
    return None


# SQLite's words for a column that is not there (in a read or an update, in an insert);
# PostgreSQL's SQLSTATE for it (its message is in the server's language).
_NO_SUCH_COLUMN = re.compile(r"no such column|has no column named")
_UNDEFINED_COLUMN = "42703"


def missing_column(exc: DatabaseError, using: str | None = None) -> tuple[str, str, str] | None:
    """``(table, column, alias)``: a column of an installed model that ``exc`` reports missing
    and that the table, in the database it is read from, does not have (a migration that
    adds it not applied); None when there is none, or the database cannot tell. The column
    of a table the error names comes first: another model may have a column of that name."""
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2
    text = str(exc)
    if sqlstate != _UNDEFINED_COLUMN and not _NO_SUCH_COLUMN.search(text):
        return None
    named = []  # (the table not named in the error, where the column is, table, column, database)
    for model in apps.get_models():
        table = model._meta.db_table
        elsewhere = re.search(rf"\b{re.escape(table)}\b", text) is None
        for column in filter(None, (field.column for field in model._meta.concrete_fields)):
            found = re.search(rf"\b{re.escape(column)}\b", text)
            if found:
                named.append((elsewhere, found.start(), table, column, using or router.db_for_read(model)))
    columns: dict[tuple[str, str], set[str] | None] = {}
    for _, _, table, column, alias in sorted(named):
        if (alias, table) not in columns:
            columns[alias, table] = _column_names(alias, table)
        present = columns[alias, table]
        if (
            present is not None
            and connections[alias].introspection.identifier_converter(column) not in present
        ):
            return table, column, alias
    return None


def _reading(alias: str, read: Callable[[BaseDatabaseWrapper], _T]) -> _T:
    """``read(connection)`` on the alias's connection. Where that fails inside a transaction
    (``call_command`` in a caller's ``atomic()``: on PostgreSQL the error being explained
    aborted it, and every statement after it fails), on a separate connection of the same
    database, closed afterwards; it stands in for the alias's connection meanwhile (in this
    thread), for what queries by alias (the migration recorder). Not on SQLite: a failed
    statement leaves its transaction usable, and a separate connection to an in-memory
    database would open another, empty one."""
    connection = connections[alias]
    try:
        return read(connection)
    except DatabaseError:
        if not connection.in_atomic_block or connection.vendor == "sqlite":
            raise
    separate = connections.create_connection(alias)
    connections[alias] = separate
    try:
        return read(separate)
    finally:
        connections[alias] = connection
        separate.close()


def _table_names(alias: str) -> set[str] | None:
    def read(connection: BaseDatabaseWrapper) -> set[str]:
        with connection.cursor() as cursor:
            return set(connection.introspection.table_names(cursor, include_views=True))

    try:
        return _reading(alias, read)
    except DatabaseError:  # unreachable: the error stands
        return None


def _column_names(alias: str, table: str) -> set[str] | None:
    """The columns of ``table``; None when it is not there (a missing table is not a missing
    column) or the database cannot tell."""

    def read(connection: BaseDatabaseWrapper) -> set[str] | None:
        with connection.cursor() as cursor:
            tables = connection.introspection.table_names(cursor, include_views=True)
            if connection.introspection.identifier_converter(table) not in tables:
                return None
            return {c.name for c in connection.introspection.get_table_description(cursor, table)}

    try:
        return _reading(alias, read)
    except DatabaseError:
        return None


def _unapplied(connection: BaseDatabaseWrapper) -> list[Migration] | None:
    """The migrations ``migrate`` would apply; None when none is applied (a new database)."""
    executor = MigrationExecutor(connection)
    if not executor.loader.applied_migrations:
        return None
    return [
        migration for migration, _backwards in executor.migration_plan(executor.loader.graph.leaf_nodes())
    ]


def _migrate_advice(alias: str) -> str:
    """Run migrate first, and which migrations that applies when the database has some
    already: the database of a release that was not migrated after its upgrade."""
    try:
        plan = _reading(alias, _unapplied)
    except Exception:  # the history unreadable or inconsistent: the advice without the list
        return "run `manage.py migrate` first"
    if plan is None:  # a new database: every migration
        return "run `manage.py migrate` first"
    unapplied: dict[str, list[str]] = {}
    for migration in plan:
        unapplied.setdefault(migration.app_label, []).append(migration.name)
    if not unapplied:  # an app without migrations, or a migration marked applied with --fake
        return "run `manage.py migrate` first (every migration is recorded as applied, though)"
    listed = "; ".join(f"{app} {_names(names)}" for app, names in unapplied.items())
    return f"run `manage.py migrate` first; not applied: {listed}"


def _names(names: list[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} to {names[-1]} ({len(names)} migrations)"


class PipedCommand(JobstateCommand):
    """A command whose output may be piped to ``head`` or a pager: when the reader
    closes the pipe, it stops quietly with BROKEN_PIPE_STATUS instead of a
    BrokenPipeError traceback (Python ignores SIGPIPE, so the write raises)."""

    def run_from_argv(self, argv: list[str]) -> None:  # the command line only, not call_command
        try:
            try:
                super().run_from_argv(argv)
            except SystemExit:  # a CommandError, or an exit status the command chose
                self.stdout.flush()  # what it printed before: the reader may have left meanwhile
                raise
            self.stdout.flush()  # here, not at exit, where a failure is "Exception ignored" (status 120)
        except BrokenPipeError:
            # What is still buffered goes nowhere, and the flush at exit cannot fail again.
            with contextlib.suppress(OSError, ValueError, AttributeError):  # not a file: a StringIO
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stdout.fileno())
                os.close(devnull)
            raise SystemExit(BROKEN_PIPE_STATUS) from None

    def write_long(self, text: str) -> None:
        """``text`` (a JSON document) and a newline, in pieces a pipe takes whole. Unbuffered
        (PYTHONUNBUFFERED), one large write that the reader cut short was written in part and
        the rest dropped without an error (stdout's text layer ignores the count its raw file
        returns): exit status 0 instead of BROKEN_PIPE_STATUS."""
        for start in range(0, len(text), _WRITE_CHARS):
            self.stdout.write(text[start : start + _WRITE_CHARS], ending="")
        self.stdout.write("")


def options_after_subcommands(parser: CommandParser) -> None:
    """Let each subcommand of ``parser`` take, after its own arguments too, the options
    ``parser`` takes before the subcommand: Django's (``--settings``, ``-v 2``,
    ``--traceback``, ...), which Django users put at the end; a subparser knows only its own.
    Call it once every subcommand is added.

    The copies have no default: argparse sets a subparser's defaults over the values given
    before the subcommand (``jobstate --force-color kinds`` would lose its colour)."""
    common = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                for option in common:
                    after = copy.copy(option)
                    after.default = argparse.SUPPRESS
                    subparser._add_action(after)


def cli_actor() -> services.Actor:
    """Changes made from the command line are recorded as ``cli:<os user>``."""
    try:
        who = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        who = "unknown"
    return services.Actor(f"cli:{who}")


# As the API's and the admin's reason fields (the history's reasons are at most this long).
REASON_MAX_LENGTH = 1000

# What a bad value can never match, for a clearer error than "bad text".
_NO_MATCH = {"owner": "; no user has such a name"}


def usable_text(value: str) -> bool:
    """Text a database can store: no NUL (PostgreSQL refuses it) and no lone
    surrogate (argv bytes that are not UTF-8 reach Python as those)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(options: Mapping[str, Any]) -> None:
    """Refuse, as a CommandError, any string argument (or item of a repeated
    one) that is not ``usable_text``: it would be a traceback further on."""
    for name, value in options.items():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str) and not usable_text(item):
                raise CommandError(
                    f"{name.replace('_', '-')}: {item!r} holds a NUL character or bytes that are not "
                    f"UTF-8{_NO_MATCH.get(name, '')}"
                )


def check_reason(options: Mapping[str, Any]) -> None:
    """Refuse, as a CommandError, a ``--reason`` longer than the API and the admin
    take: it was recorded whole, where they refuse it."""
    reason = options.get("reason")
    if isinstance(reason, str) and len(reason) > REASON_MAX_LENGTH:
        raise CommandError(
            f"--reason is {len(reason):,} characters long: at most {REASON_MAX_LENGTH:,}, as in the "
            "API and the admin"
        )


def not_blank(value: str | None, option: str, hint: str = "") -> str | None:
    """``value``, None when the option was left out; a CommandError naming ``option``
    when it was given empty or blank (a shell variable that is empty or unset)."""
    if value is not None and not value.strip():
        raise CommandError(f"{option} is empty{hint}")
    return value


def job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw.strip())
    except (ValueError, AttributeError):
        raise CommandError(
            f"'{raw}' is not a job id: give the full UUID, like 3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43"
        ) from None


def json_object(raw: str, option: str = "--params") -> dict[str, Any]:
    """``raw`` read as a JSON object, or a CommandError naming ``option``."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; too many digits; too deep
        raise CommandError(f"{option} is not JSON we can read: {exc}") from None
    if not isinstance(value, dict):
        raise CommandError(f'{option} must be a JSON object, like \'{{"month": "2026-10"}}\'')
    return value


def get_job(raw: str) -> Job:
    pk = job_id(raw)
    try:
        return Job.objects.select_related("owner").get(pk=pk)
    except Job.DoesNotExist:
        raise CommandError(f"No job {pk}") from None


def one_line(exc: BaseException) -> str:
    """A ValidationError's messages (``field: message; ...``) or the error's text."""
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            parts = []
            for field, errors in exc.message_dict.items():
                for message in errors:
                    parts.append(message if field in ("__all__", "kind") else f"{field}: {message}")
            return "; ".join(parts)
        return "; ".join(str(m) for m in exc.messages)
    return str(exc).replace("\n", " ")


def fail(exc: BaseException, prefix: str = "") -> CommandError:
    return CommandError(f"{prefix}{one_line(exc)}")
