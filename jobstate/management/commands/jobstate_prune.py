"""Delete finished jobs (with their history, assets and files) past retention."""

import math
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from jobstate import conf
from jobstate.management.commands._common import JobstateCommand
from jobstate.worker.retention import MAX_DAYS, prune

MAX_BATCH = 100_000


class Command(JobstateCommand):
    help = (
        "Delete finished jobs older than JOBSTATE['RETENTION_DAYS'] (or --days), with the webhook "
        "delivery records and the records of kind pauses resumed as long ago, in batches, until "
        "done (or, with --max-seconds, until that time has passed: it then says more remains; run it "
        "again)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=float,
            help="Override JOBSTATE['RETENTION_DAYS'] (jobs finished less than "
            "JOBSTATE['METRICS_SETTLE_SECONDS'] ago stay, even with --days 0).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Only count what would go.")
        parser.add_argument("--batch", type=int, help="Jobs per transaction (JOBSTATE['PRUNE_BATCH']).")
        parser.add_argument(
            "--max-seconds",
            type=float,
            help="Stop between batches after this many seconds (the scheduled prune stops after "
            "JOBSTATE['PRUNE_MAX_SECONDS']); by default run until done.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # The arguments first: a bad one is an error even when there is nothing to do.
        if options["batch"] is not None and not 1 <= options["batch"] <= MAX_BATCH:
            raise CommandError(f"--batch must be between 1 and {MAX_BATCH}")
        max_seconds = options["max_seconds"]
        if max_seconds is not None and not 0 < max_seconds < math.inf:  # NaN fails too
            raise CommandError("--max-seconds must be a finite number greater than 0")
        days = options["days"] if options["days"] is not None else conf.get("RETENTION_DAYS")
        if days is None:
            self.stdout.write("RETENTION_DAYS is None: finished jobs are kept; nothing to do.")
            return
        if options["days"] is not None and not 0 <= days <= MAX_DAYS:  # NaN fails too
            raise CommandError(f"--days must be between 0 and {MAX_DAYS}")
        if not days >= 0:  # NaN fails too
            raise CommandError("RETENTION_DAYS must be zero or more")
        report = prune(days, dry_run=options["dry_run"], batch=options["batch"], max_seconds=max_seconds)
        verb = "would delete" if report.dry_run else "deleted"
        self.stdout.write(
            f"{verb} {report.jobs} job(s), {report.events} event(s), {report.assets} asset(s) "
            f"finished before {_moment(report.cutoff)}; "
            f"{report.deliveries} webhook delivery record(s) older than that; "
            f"{report.pauses} kind pause record(s) resumed before that; "
            f"{len(report.orphan_files)} orphan file(s)"
        )
        if report.more:  # not an error (status 0): the next run takes the rest
            self.stdout.write(
                f"more remains: this run stopped after {max_seconds:g} s (--max-seconds); run it again",
                self.style.WARNING,
            )


def _moment(moment: datetime | None) -> str:
    """With its zone's name: an aware time's own (UTC); a naive one (``USE_TZ = False``) is
    in ``TIME_ZONE``, which ``%Z`` printed as nothing ("18:37:15 ;")."""
    if moment is None:
        return "-"
    zone = moment.tzname() or timezone.get_default_timezone_name()
    return f"{moment:%Y-%m-%d %H:%M:%S} {zone}"
