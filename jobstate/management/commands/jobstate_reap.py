"""Run the reaper once: requeue, fail or cancel processing jobs whose lease expired."""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from jobstate import services
from jobstate.management.commands._common import JobstateCommand

DEFAULT_LIMIT = 500  # services.requeue_expired's
MAX_LIMIT = 100_000


class Command(JobstateCommand):
    help = (
        "Requeue processing jobs whose worker was lost (lease expired), or fail them (no attempt "
        "left), or cancel them (a cancel was requested), once, oldest expiry first, at most --limit "
        "of them; prints how many of each and says so when more remain (run it again). "
        "Exits with status 1 if reaping a job raised an error (logged)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit",
            type=int,
            default=DEFAULT_LIMIT,
            help=f"Jobs reaped at most in this run (default {DEFAULT_LIMIT}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        limit = options["limit"]
        if not 1 <= limit <= MAX_LIMIT:
            raise CommandError(f"--limit must be between 1 and {MAX_LIMIT}")
        report = services.requeue_expired(limit=limit)
        outcomes = {"requeued": report.requeued, "failed": report.failed, "cancelled": report.cancelled}
        if report.skipped:  # held by a transaction (the handler's own, often): next time
            outcomes["left for the next sweep"] = report.skipped
        if report.errors:  # reaping them raised: see the log
            outcomes["not reaped (an error, logged)"] = report.errors
        self.stdout.write(", ".join(f"{label} {len(ids)}" for label, ids in outcomes.items()))
        for label, ids in outcomes.items():
            for pk in ids:
                self.stdout.write(f"  {label} {pk}", self.style.WARNING)
        if report.more:  # not an error (status 0): the next sweep, or this command again, takes them
            self.stdout.write(
                f"more expired jobs remain: this run stopped at its limit ({limit}, --limit); run it again",
                self.style.WARNING,
            )
        if report.errors:  # exit status 1: a cron job or a deploy script should notice
            raise CommandError(f"{len(report.errors)} expired job(s) not reaped: an error each, see the log")
