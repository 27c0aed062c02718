"""``manage.py jobstate_move_hot_columns``: on PostgreSQL, move the columns a
running job, its claim and its outcome write to the end of ``jobstate_job``'s
rows, where migrations 0015 and 0017 left them in place (a table of more than
``layout.MIGRATION_MAX_ROWS`` jobs).

Rewrites every row once, and builds the indexes that name those columns again,
under an exclusive lock on the table: reads and writes wait until it ends. Run it
when workers, the admin and the API may pause, then ``VACUUM FULL jobstate_job``
(or pg_repack) to give back the old row versions.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from jobstate.management.commands._common import check_text
from jobstate.models import layout


class Command(BaseCommand):
    help = (
        "Move the columns a running job, its claim and its outcome write to the end of "
        "jobstate_job's rows (PostgreSQL)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help=f"the alias in DATABASES of the database to change (default '{DEFAULT_DB_ALIAS}')",
        )
        parser.add_argument(
            "--check", action="store_true", help="only say whether they are in place (exit 1 when not)"
        )
        parser.add_argument(
            "--lock-timeout",
            type=float,
            metavar="SECONDS",
            help="give up, moving nothing, if the table's lock is not had within SECONDS (by default "
            "it waits for every query on the table, and every later query waits behind it)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options)
        if options["database"] not in connections:
            raise CommandError(f"--database: no database {options['database']!r} in settings.DATABASES")
        # The arguments first: a bad one is an error even when there is nothing to do.
        wait = options["lock_timeout"]
        if wait is not None and not 0 < wait < 86400:  # NaN fails too
            raise CommandError("--lock-timeout: a number of seconds above 0 (and under a day).")
        connection = connections[options["database"]]
        if connection.vendor != "postgresql":
            self.stdout.write("Nothing to do: the column order matters on PostgreSQL only.")
            return
        if options["check"]:
            if not layout.in_place(connection):
                raise CommandError(
                    "The columns that running jobs, claims and outcomes write are not at the end of "
                    "jobstate_job's rows."
                )
            self.stdout.write("In place.")
            return
        with transaction.atomic(using=options["database"]):
            outcome = layout.move_last(
                connection, lock_wait=None if wait is None else f"{max(1, int(wait * 1000))}ms"
            )
        if outcome.startswith("skipped"):
            raise CommandError(
                f"Nothing moved: the table was in use for {wait:g} s (--lock-timeout). Try again when "
                "fewer queries run, or with a longer --lock-timeout."
            )
        if outcome.startswith("refused"):
            raise CommandError(
                f"Nothing moved: {outcome.removeprefix('refused: ')}. Each would be lost with its column;"
                " drop it first (and create it again after), or keep the order as it is."
            )
        self.stdout.write("Moved." if outcome == "moved" else "In place already.")
