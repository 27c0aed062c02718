"""Install or update jobstate's django-q2 Schedules (reaper every minute, pruning daily)."""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from jobstate import conf
from jobstate.management.commands._common import JobstateCommand, check_text, not_blank
from jobstate.worker import schedules


class Command(JobstateCommand):
    help = (
        "Install or update the django-q2 Schedules: the reaper every minute, pruning daily. They "
        "run in the cluster --cluster names; a rerun without it keeps the cluster they have."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Both at once was --remove, silently: which did the operator mean?
        either = parser.add_mutually_exclusive_group()
        either.add_argument(
            "--no-prune",
            action="store_true",
            help="Do not schedule retention pruning (and remove its schedule if installed).",
        )
        either.add_argument("--remove", action="store_true", help="Remove jobstate's schedules.")
        parser.add_argument(
            "--cluster",
            metavar="NAME",
            help="Run the schedules only in the django-q2 cluster NAME: its Q_CLUSTER['cluster_name'] "
            "(or, without one, its 'name'), for a project with several clusters. Without it, new "
            "schedules run in any cluster whose cluster_name is its name, and installed ones keep the "
            "cluster they have (--remove, then a run without --cluster, clears it).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text({"cluster": options["cluster"]})
        cluster = not_blank(options["cluster"], "--cluster", ": name the cluster, or leave the option out")
        if cluster is not None and cluster != cluster.strip():  # no cluster has such a name
            raise CommandError(f"--cluster {cluster!r} has spaces around it")
        if cluster is not None and len(cluster) > schedules.CLUSTER_MAX_LENGTH:
            raise CommandError(f"--cluster is longer than {schedules.CLUSTER_MAX_LENGTH} characters")
        if options["remove"]:
            if cluster is not None:
                raise CommandError("--cluster is not allowed with --remove")
            self.stdout.write(f"removed {schedules.uninstall()} schedule(s)")
            return
        for name, outcome in schedules.install(prune=not options["no_prune"], cluster=cluster).items():
            self.stdout.write(f"{outcome}: {name}")
        for name, kept in schedules.pinned().items():
            if cluster is None:  # an operator's choice, left as it was: say so
                self.stdout.write(f"kept cluster {kept!r}: {name} (--cluster NAME changes it)")
            else:
                self.stdout.write(f"cluster {kept!r}: {name}")
        if not options["no_prune"] and conf.get("RETENTION_DAYS") is None:  # install() left it out
            self.stdout.write(
                f"not scheduled: {schedules.PRUNE} (RETENTION_DAYS is None: finished jobs are kept)"
            )
