"""Run the reaper once: requeue (or fail) processing jobs whose lease expired."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobstate import services


class Command(BaseCommand):
    help = (
        "Requeue or fail processing jobs whose worker was lost (lease expired), once. "
        "Exits with status 1 if reaping a job raised an error (logged)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = services.requeue_expired()
        outcomes = {"requeued": report.requeued, "failed": report.failed, "cancelled": report.cancelled}
        if report.skipped:  # held by a transaction (the handler's own, often): next time
            outcomes["left for the next sweep"] = report.skipped
        if report.errors:  # reaping them raised: see the log
            outcomes["not reaped (an error, logged)"] = report.errors
        self.stdout.write(", ".join(f"{label} {len(ids)}" for label, ids in outcomes.items()))
        for label, ids in outcomes.items():
            for pk in ids:
                self.stdout.write(f"  {label} {pk}", self.style.WARNING)
        if report.errors:  # exit status 1: a cron job or a deploy script should notice
            raise CommandError(f"{len(report.errors)} expired job(s) not reaped: an error each, see the log")
