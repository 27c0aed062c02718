"""Print the jobs that need a person; the exit code suits monitoring checks.

Exit codes (Nagios style): 0 nothing to report; 1 only jobs that recently
failed after their last attempt; 2 at least one active job is stuck; 3 (unknown)
the check could not run: a bad argument, the database unreachable; 141 the reader
of the output closed the pipe (``jobstate_stuck | head -1``), as for ``jobstate``.
"""

from __future__ import annotations

import json
import shlex
import traceback
from typing import Any

from django.core.management.base import CommandError, CommandParser

from jobstate import conf, stuck
from jobstate.management.commands._common import BROKEN_PIPE_STATUS, PipedCommand

UNKNOWN = 3

# The ``manage.py jobstate`` subcommand that applies each remedy, as the stuck page's click
# does (a queued job no worker serves: its click cancels it).
REMEDY_COMMANDS = {
    stuck.REQUEUE: ("requeue",),
    stuck.FORCE_CANCEL: ("cancel", "--now"),
    stuck.RETRY: ("retry",),
    stuck.START_WORKER: ("cancel",),
}


def remedy_command(finding: stuck.Finding) -> str:
    """The command line that applies ``finding``'s remedy to its job, runnable as printed,
    with the reason the stuck page's click records."""
    words: tuple[str, ...]
    if finding.remedy == stuck.RESUME_KIND:  # the kind, not the job: every job of it is claimed again
        words = ("python", "manage.py", "jobstate", "resume", finding.job.kind)
    else:
        words = ("python", "manage.py", "jobstate", *REMEDY_COMMANDS[finding.remedy], str(finding.job.pk))
    return shlex.join((*words, "--reason", f"stuck remedy ({finding.title.lower()})"))


class Verdict(SystemExit):
    """The exit status the findings call for (1 or 2)."""


class Command(PipedCommand):
    help = (
        "List stuck jobs with their reason and remedy. Exit 0: none, 1: recent failures only, "
        "2: stuck, 3: the check could not run, 141: the reader closed the pipe."
    )

    def run_from_argv(self, argv: list[str]) -> None:
        # Exit 1 (a CommandError) or 2 (argparse's for a bad argument) would read as
        # recent failures or stuck jobs to a monitoring system: a failed check is 3. A closed
        # pipe (PipedCommand's 141) is not a failed check either.
        try:
            super().run_from_argv(argv)
        except Verdict:
            raise
        except SystemExit as stop:
            if stop.code and stop.code != BROKEN_PIPE_STATUS:
                raise SystemExit(UNKNOWN) from None
            raise
        except Exception:
            traceback.print_exc()
            raise SystemExit(UNKNOWN) from None

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reason",
            action="append",
            choices=[r.code for r in stuck.REASONS],
            help="Only these reasons (repeatable).",
        )
        parser.add_argument(
            "--ignore",
            action="append",
            choices=[r.code for r in stuck.REASONS],
            default=[],
            help="Leave these reasons out (repeatable), e.g. --ignore recently_failed "
            "(leaving no reason to check is an error, exit 3).",
        )
        parser.add_argument("--limit", type=int, default=20, help="Jobs printed per reason (default 20).")
        parser.add_argument("--json", action="store_true", help="Print JSON: counts and findings.")
        parser.add_argument("--counts", action="store_true", help="Print only the counts per reason.")
        # Counts stop at JOBSTATE["ADMIN_COUNT_CAP"], so the check stays cheap: more
        # than that is printed as "N+" (counted one past it to tell), JSON says N. The
        # text writes them with thousands separators, as the admin's stuck page does.

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["limit"] <= 10_000:
            raise CommandError("--limit must be between 0 and 10000")
        codes = [
            r.code
            for r in stuck.REASONS
            if (not options["reason"] or r.code in options["reason"]) and r.code not in options["ignore"]
        ]
        if not codes:
            # A monitoring check that looks at nothing would stay green for ever.
            raise CommandError("--reason and --ignore leave no reason to check")
        self.cap = int(conf.get("ADMIN_COUNT_CAP"))
        findings: list[stuck.Finding] = []
        if options["counts"]:
            counted = stuck.count_stuck(codes=codes, cap=self.cap + 1)
        else:
            findings, counted = stuck.survey(codes=codes, limit=options["limit"], cap=self.cap + 1)
        self.over = {c for c, n in counted.items() if n > self.cap}
        counts = {c: min(self.cap, n) for c, n in counted.items()}
        if options["json"]:
            rows = [{**f.as_dict(), "command": remedy_command(f)} for f in findings]
            payload = {"counts": counts, "findings": rows}
            self.write_long(json.dumps(payload, indent=2))
        else:
            self._print(counts, findings)
        code = 0
        if any(counts[c] for c in codes if c in stuck.ACTIVE_REASONS):
            code = 2
        elif any(counts.values()):
            code = 1
        if code:
            raise Verdict(code)

    def _print(self, counts: dict[str, int], findings: list[stuck.Finding]) -> None:
        total = sum(counts.values())
        if not total:
            self.stdout.write(self.style.SUCCESS("No stuck jobs."))
            return
        by_reason: dict[str, list[stuck.Finding]] = {}
        for finding in findings:
            by_reason.setdefault(finding.reason, []).append(finding)
        for r in stuck.REASONS:
            n = counts.get(r.code, 0)
            if not n:
                continue
            plus = "+" if r.code in self.over else ""
            self.stdout.write(self.style.WARNING(f"{r.title} [{r.code}]: {n:,}{plus}"))
            self.stdout.write(f"  remedy: {r.remedy_text}")
            for f in by_reason.get(r.code, []):
                self.stdout.write(f"  {f.job.pk}  {f.job.kind}  {f.text}")
                self.stdout.write(f"    run: {remedy_command(f)}")
            shown = len(by_reason.get(r.code, []))
            if findings and shown < n:
                self.stdout.write(f"  ... and {n - shown:,}{plus} more")
