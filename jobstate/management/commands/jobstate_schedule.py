"""Install or update jobstate's django-q2 Schedules (reaper every minute, pruning daily)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobstate import conf
from jobstate.worker import schedules


class Command(BaseCommand):
    help = "Install or update the django-q2 Schedules: the reaper every minute, pruning daily."

    def add_arguments(self, parser: CommandParser) -> None:
        # Both at once was --remove, silently: which did the operator mean?
        either = parser.add_mutually_exclusive_group()
        either.add_argument(
            "--no-prune",
            action="store_true",
            help="Do not schedule retention pruning (and remove its schedule if installed).",
        )
        either.add_argument("--remove", action="store_true", help="Remove jobstate's schedules.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["remove"]:
            self.stdout.write(f"removed {schedules.uninstall()} schedule(s)")
            return
        for name, outcome in schedules.install(prune=not options["no_prune"]).items():
            self.stdout.write(f"{outcome}: {name}")
        if not options["no_prune"] and conf.get("RETENTION_DAYS") is None:  # install() left it out
            self.stdout.write(
                f"not scheduled: {schedules.PRUNE} (RETENTION_DAYS is None: finished jobs are kept)"
            )
