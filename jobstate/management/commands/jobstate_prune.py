"""Delete finished jobs (with their history, assets and files) past retention."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobstate import conf
from jobstate.worker.retention import MAX_DAYS, prune

MAX_BATCH = 100_000


class Command(BaseCommand):
    help = "Delete finished jobs older than JOBSTATE['RETENTION_DAYS'] (or --days), in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=float, help="Override JOBSTATE['RETENTION_DAYS'].")
        parser.add_argument("--dry-run", action="store_true", help="Only count what would go.")
        parser.add_argument("--batch", type=int, help="Jobs per transaction (JOBSTATE['PRUNE_BATCH']).")

    def handle(self, *args: Any, **options: Any) -> None:
        # The arguments first: a bad one is an error even when there is nothing to do.
        if options["batch"] is not None and not 1 <= options["batch"] <= MAX_BATCH:
            raise CommandError(f"--batch must be between 1 and {MAX_BATCH}")
        days = options["days"] if options["days"] is not None else conf.get("RETENTION_DAYS")
        if days is None:
            self.stdout.write("RETENTION_DAYS is None: finished jobs are kept; nothing to do.")
            return
        if options["days"] is not None and not 0 <= days <= MAX_DAYS:  # NaN fails too
            raise CommandError(f"--days must be between 0 and {MAX_DAYS}")
        if not days >= 0:  # NaN fails too
            raise CommandError("RETENTION_DAYS must be zero or more")
        report = prune(days, dry_run=options["dry_run"], batch=options["batch"])
        verb = "would delete" if report.dry_run else "deleted"
        self.stdout.write(
            f"{verb} {report.jobs} job(s), {report.events} event(s), {report.assets} asset(s) "
            f"finished before {report.cutoff:%Y-%m-%d %H:%M:%S %Z}; "
            f"{report.deliveries} webhook delivery record(s) older than that; "
            f"{len(report.orphan_files)} orphan file(s)"
        )
