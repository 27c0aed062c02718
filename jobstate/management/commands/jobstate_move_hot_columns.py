"""``manage.py jobstate_move_hot_columns``: on PostgreSQL, move the columns a
running job, its claim and its outcome write to the end of ``jobstate_job``'s
rows, where migrations 0015 and 0017 left them in place (a table of more than
``layout.MIGRATION_MAX_ROWS`` jobs).

Rewrites every row once, and builds the indexes that name those columns again,
under an exclusive lock on the table: reads and writes wait until it ends. Run it
when workers, the admin and the API may pause, then ``VACUUM FULL jobstate_job``
(or pg_repack) to give back the old row versions. It waits ``DEFAULT_LOCK_TIMEOUT``
seconds for that lock, then gives up: while it waits, every later query on the
table waits behind it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from jobstate.management.commands._common import JobstateCommand, check_text
from jobstate.models import layout

# Seconds to wait for the table's lock unless --lock-timeout says otherwise: a long
# query would otherwise stall every later query on the table (an outage) behind ours.
DEFAULT_LOCK_TIMEOUT = 5.0


class Command(JobstateCommand):
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
            help=f"give up, moving nothing, if the table's lock is not had within SECONDS (default "
            f"{DEFAULT_LOCK_TIMEOUT:g}: while the command waits, every later query on the table waits "
            "behind it); 0 waits for as long as the queries on the table take",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options)
        if options["database"] not in connections:
            raise CommandError(f"--database: no database {options['database']!r} in settings.DATABASES")
        # The arguments first: a bad one is an error even when there is nothing to do.
        given = options["lock_timeout"]
        wait = DEFAULT_LOCK_TIMEOUT if given is None else given
        if not 0 <= wait < 86400:  # NaN fails too
            raise CommandError(
                "--lock-timeout: a number of seconds from 0 (wait as long as it takes) to under a day."
            )
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
                connection, lock_wait=None if wait == 0 else f"{max(1, int(wait * 1000))}ms"
            )
        if outcome.startswith("skipped"):
            default = " by default" if given is None else ""
            raise CommandError(
                f"Nothing moved: the table was in use for {wait:g} s (--lock-timeout{default}). Try "
                "again when fewer queries run (a long query or an open transaction holds the table: "
                "see pg_stat_activity), or with a longer --lock-timeout (0 waits for as long as it "
                "takes, and every later query on the table waits behind the command)."
            )
        if outcome.startswith("refused"):
            raise CommandError(
                f"Nothing moved: {outcome.removeprefix('refused: ')}. Each would be lost with its column;"
                " drop it first (and create it again after), or keep the order as it is."
            )
        self.stdout.write("Moved." if outcome == "moved" else "In place already.")
