"""``manage.py jobstate``: enqueue, cancel, retry, requeue, fail and inspect jobs from a shell.

Every change goes through ``jobstate.services`` and is recorded in the job's
history with the actor ``cli:<os user>``. Errors are one line (exit status 1); a reader
that closes the pipe early (``| head``) ends the command quietly (exit status 141).

    manage.py jobstate kinds
    manage.py jobstate enqueue reports.build --params '{"month": "2026-10"}' --owner alice
    manage.py jobstate show 3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43
    manage.py jobstate cancel 3f2a9c1e-... --reason "wrong month"
    manage.py jobstate cancel 3f2a9c1e-... --now --reason "worker hung"
    manage.py jobstate retry 3f2a9c1e-...
    manage.py jobstate requeue 3f2a9c1e-... --reason "worker lost"
    manage.py jobstate fail 3f2a9c1e-... --reason "bad input"
    manage.py jobstate pause emails.send --reason "mail API down"
    manage.py jobstate paused
    manage.py jobstate resume emails.send --reason "mail API back"
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobstate import conf, registry, services
from jobstate.exceptions import InvalidTransition, JobStateError, LeaseLost, PauseRefused, UnknownKind
from jobstate.management.commands import _show
from jobstate.management.commands._common import (
    PipedCommand,
    check_reason,
    check_text,
    cli_actor,
    fail,
    get_job,
    json_object,
    not_blank,
    options_after_subcommands,
)
from jobstate.models import Job
from jobstate.services.control import cancel_run_pending
from jobstate.services.pauses import describe as describe_pause
from jobstate.services.pauses import queued_counts
from jobstate.states import Status


class Command(PipedCommand):
    help = (
        "Enqueue, cancel, retry, requeue, fail and show jobs; list the registered kinds; pause and "
        "resume a kind."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="action",
            required=True,
            metavar="COMMAND",  # the list wraps differently from one Python release to the next
        )
        enqueue = sub.add_parser("enqueue", help="Queue a job; prints its id.")
        enqueue.add_argument("kind", help="A registered kind (see `jobstate kinds`).")
        enqueue.add_argument("--params", default="{}", help="Parameters as a JSON object (default {}).")
        enqueue.add_argument("--owner", help="User name of the job's owner (default: none, a system job).")
        enqueue.add_argument(
            "--key",
            help="Idempotency key: the job with this key, active or else the last completed one "
            "(until retention deletes it), is printed instead.",
        )
        enqueue.add_argument("--priority", type=int, default=0, help="Higher runs first (default 0).")
        enqueue.add_argument("--run-after", dest="run_after", help="Not before this ISO 8601 time.")
        enqueue.add_argument("--reason", default="", help="Recorded in the history.")
        cancel = sub.add_parser(
            "cancel",
            help="Cancel a queued or waiting job at once (a workflow with undo_on_cancel and undos "
            "to run is queued for one run of them first, then ends cancelled); ask a running one to stop.",
        )
        cancel.add_argument("job", help="The job's id.")
        cancel.add_argument(
            "--now",
            action="store_true",
            help="Cancel a running job whose cancel was requested now, on behalf of its worker "
            "(lost or hung), as the stuck remedy does: its worker's lease stops working. A queued "
            "job with a cancel request is cancelled at once, without the run of its undos if one "
            "was pending.",
        )
        cancel.add_argument("--reason", default="", help="Recorded in the history.")
        retry = sub.add_parser(
            "retry", help="Queue a finished job again as a new, linked job; prints its id."
        )
        retry.add_argument("job", help="The job's id.")
        retry.add_argument("--reason", default="", help="Recorded in the history.")
        requeue = sub.add_parser(
            "requeue",
            help="Put a running job back in the queue (its worker's lease stops working; one more "
            "attempt if none is left); wake a waiting one.",
        )
        requeue.add_argument("job", help="The job's id.")
        requeue.add_argument("--reason", default="", help="Recorded in the history.")
        fail_ = sub.add_parser("fail", help="End a queued, waiting or running job failed; it is not retried.")
        fail_.add_argument("job", help="The job's id.")
        fail_.add_argument("--reason", required=True, help="Recorded in the history and as the job's error.")
        sub.add_parser("kinds", help="List the registered kinds and their options.")
        show = sub.add_parser(
            "show",
            help="Status, progress, attempts, watermarks, cancel and stop requests, related jobs (parent, "
            "retries, children), error, history and assets of a job, then the traceback of its error.",
        )
        show.add_argument("job", help="The job's id.")
        show.add_argument("--json", action="store_true", help="Print JSON.")
        pause = sub.add_parser(
            "pause",
            help="Pause a kind: no worker claims its queued jobs until it is resumed (they stay queued; "
            "enqueue goes on; running jobs finish).",
        )
        pause.add_argument("kind", help="A registered kind, or one with jobs stored.")
        pause.add_argument("--reason", required=True, help="Why: shown with the pause, kept in its record.")
        resume = sub.add_parser("resume", help="Resume a paused kind: its queued jobs are claimed again.")
        resume.add_argument("kind", help="The paused kind (see `jobstate paused`).")
        resume.add_argument("--reason", default="", help="Kept in the pause's record.")
        sub.add_parser("paused", help="List the paused kinds: by whom, since when, why, how many queued.")
        options_after_subcommands(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options)
        check_reason(options)
        action = options["action"]
        named = "cancel --now" if action == "cancel" and options["now"] else action
        try:
            getattr(self, f"do_{action}")(options)
        except CommandError:
            raise
        except (InvalidTransition, PauseRefused) as exc:
            raise CommandError(f"{named} refused: {exc.refusal}") from None
        except LeaseLost:  # its worker ended it meanwhile: nothing written
            raise CommandError(
                f"{named} refused: the job's worker ended it meanwhile; nothing changed"
            ) from None
        except (ValidationError, JobStateError, Job.DoesNotExist) as exc:  # deleted meanwhile
            raise fail(exc, f"{action}: ") from None

    # --- subcommands ---------------------------------------------------------------

    def do_enqueue(self, options: dict[str, Any]) -> None:
        job, created = services.get_or_enqueue(
            options["kind"],
            json_object(options["params"]),
            owner=self._owner(options["owner"]),
            key=options["key"],
            priority=options["priority"],
            run_after=self._moment(options["run_after"]),
            actor=cli_actor(),
            reason=options["reason"] or "enqueued from the command line",
        )
        self.stdout.write(str(job.pk))
        if not created:  # the key's active job, or its last completed one
            self.stderr.write(f"A job with key '{options['key']}' exists ({job.status}); nothing queued.")

    def do_cancel(self, options: dict[str, Any]) -> None:
        if options["now"]:
            was = get_job(options["job"])
            job = services.force_cancel(was, cli_actor(), options["reason"])
            if was.status != Status.QUEUED:
                self.stdout.write(f"cancelled {job.pk} on behalf of its worker")
            else:
                self.stdout.write(
                    f"cancelled {job.pk}" + (", its undos not run" if cancel_run_pending(was) else "")
                )
            return
        before = get_job(options["job"])
        job = services.request_cancel(before, cli_actor(), options["reason"])
        if job.status == Status.CANCELLED:
            self.stdout.write(f"cancelled {job.pk}")
            return
        if job.status == Status.QUEUED:
            self.stdout.write(
                f"cancel requested for {job.pk}: queued for one run of its undos, then it ends cancelled "
                "(cancel --now ends it without them)"
            )
            return
        grace = float(conf.get("CANCEL_GRACE_SECONDS"))
        stops = (
            "its worker stops it at the next check (a heartbeat or progress report), or by force "
            f"CANCEL_GRACE_SECONDS ({_seconds(grace)}) later"
        )
        if before.cancel_requested_at is not None:  # the first request stands
            when = _show.when(job.cancel_requested_at)
            self.stdout.write(f"cancel already requested for {job.pk} at {when}: {stops}")
        else:
            self.stdout.write(f"cancel requested for {job.pk}: {stops}")

    def do_retry(self, options: dict[str, Any]) -> None:
        try:
            new = services.retry(get_job(options["job"]), cli_actor(), options["reason"])
        except UnknownKind as exc:  # its handler removed since: no "kind" option to blame
            raise CommandError(f"retry: {exc.retry_refusal}") from None
        self.stdout.write(str(new.pk))

    def do_requeue(self, options: dict[str, Any]) -> None:
        before = get_job(options["job"])
        job = services.requeue(before, cli_actor(), options["reason"])
        if before.status == Status.WAITING:
            self.stdout.write(f"woke {job.pk}: it runs again now")
        elif job.status == Status.QUEUED and job.run_after > timezone.now():
            self.stdout.write(
                f"requeued {job.pk}: its next attempt starts after {_show.when(job.run_after)}, "
                "when its old lease would have run out (its worker's watchdog stops it by then)"
            )
        else:
            self.stdout.write(f"requeued {job.pk}")

    def do_fail(self, options: dict[str, Any]) -> None:
        reason = not_blank(options["reason"], "--reason", ": say why the job fails (stored as its error)")
        job = services.force_fail(get_job(options["job"]), cli_actor(), reason or "")
        self.stdout.write(f"failed {job.pk}")

    def do_kinds(self, options: dict[str, Any]) -> None:
        handlers = registry.all_handlers()
        if not handlers:
            self.stdout.write("No kind is registered (handlers are found in each app's jobs.py).")
            return
        default_attempts = conf.get("DEFAULT_MAX_ATTEMPTS")
        default_timeout = conf.get("DEFAULT_TIMEOUT")
        for name, spec in sorted(handlers.items()):
            self.stdout.write(
                self.style.SUCCESS(name) + (f"  {spec.description}" if spec.description else "")
            )
            facts = [
                f"max_attempts={spec.max_attempts or default_attempts}",
                f"timeout={_seconds(spec.timeout or default_timeout)}",
                f"concurrency={spec.concurrency or 'unlimited'}",
                f"api={spec.api!r}",  # the API refuses a kind it may not start as unknown
            ]
            if spec.retry_backoff is not None:
                backoff = spec.retry_backoff
                shown = getattr(backoff, "__name__", backoff) if callable(backoff) else _seconds(backoff)
                facts.append(f"retry_backoff={shown}")
            if spec.schema is not None:
                facts.append(f"schema={getattr(spec.schema, '__name__', type(spec.schema).__name__)}")
            facts += [
                f"{k}={getattr(v, '__qualname__', None) or repr(v)}" for k, v in sorted(spec.options.items())
            ]
            self.stdout.write("  " + ", ".join(facts))

    def do_show(self, options: dict[str, Any]) -> None:
        shown = _show.read(get_job(options["job"]))
        if options["json"]:
            self.write_long(_show.as_json(shown))
            return
        for line in _show.lines(shown):
            self.stdout.write(line)

    def do_pause(self, options: dict[str, Any]) -> None:
        reason = not_blank(options["reason"], "--reason", ": say why the kind is paused")
        pause = services.pause_kind(options["kind"], cli_actor(), reason or "")
        queued = queued_counts([pause.kind])[pause.kind]
        self.stdout.write(
            f"paused {pause.kind}: {queued} queued job(s) stay queued until "
            f"`manage.py jobstate resume {pause.kind}`"
        )

    def do_resume(self, options: dict[str, Any]) -> None:
        pause = services.resume_kind(options["kind"], cli_actor(), options["reason"])
        self.stdout.write(f"resumed {pause.kind} (paused {describe_pause(pause)})")

    def do_paused(self, options: dict[str, Any]) -> None:
        pauses = services.paused_kinds()
        if not pauses:
            self.stdout.write("No kind is paused.")
            return
        counts = queued_counts([p.kind for p in pauses])
        for pause in pauses:
            shown = f"{counts[pause.kind]} queued, paused {describe_pause(pause)}"
            self.stdout.write(f"{self.style.WARNING(pause.kind)}  {shown}")

    # --- helpers ---------------------------------------------------------------------

    @staticmethod
    def _owner(raw: str | None) -> Any:
        name = not_blank(raw, "--owner", ": give a user name, or leave --owner out for a system job")
        if name is None:
            return None
        User = get_user_model()
        try:
            return User.objects.get(**{User.USERNAME_FIELD: name})
        except User.DoesNotExist:
            raise CommandError(f"--owner: no user '{name}'") from None

    @staticmethod
    def _moment(raw: str | None) -> datetime | None:
        raw = not_blank(raw, "--run-after", ": give an ISO 8601 time, or leave --run-after out to run it now")
        if raw is None:
            return None
        try:
            moment = parse_datetime(raw)
        except ValueError:
            moment = None
        if moment is None:
            raise CommandError(
                f"--run-after: '{raw}' is not an ISO 8601 time, like 2026-11-23T18:00:00+00:00"
            )
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        return moment


def _seconds(value: float) -> str:
    """``60s`` for 60 and 60.0, ``0.5s``: a whole number without its ``.0``."""
    return f"{int(value)}s" if float(value).is_integer() else f"{value}s"
