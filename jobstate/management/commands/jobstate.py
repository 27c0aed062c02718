"""``manage.py jobstate``: enqueue, cancel, retry and inspect jobs from a shell.

Every change goes through ``jobstate.services`` and is recorded in the job's
history with the actor ``cli:<os user>``. Errors are one line (exit status 1).

    manage.py jobstate kinds
    manage.py jobstate enqueue reports.build --params '{"month": "2026-10"}' --owner alice
    manage.py jobstate show 3f2a9c1e-8d4b-4e0f-9a6b-2c1d0e7f5a43
    manage.py jobstate cancel 3f2a9c1e-... --reason "wrong month"
    manage.py jobstate retry 3f2a9c1e-...
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobstate import conf, registry, services
from jobstate.exceptions import InvalidTransition, JobStateError, UnknownKind
from jobstate.management.commands._common import (
    check_reason,
    check_text,
    cli_actor,
    fail,
    get_job,
    json_object,
    not_blank,
)
from jobstate.models import Job
from jobstate.states import ACTIVE, Status

HISTORY_ROWS = 50
REFUSED = {
    "cancel": "only a queued, waiting or running job can be cancelled",
    "retry": "only a finished job can be retried",
}


class Command(BaseCommand):
    help = "Enqueue, cancel, retry and show jobs; list the registered kinds."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{enqueue,cancel,retry,kinds,show}")
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
            "cancel", help="Cancel a queued or waiting job at once; ask a running one to stop."
        )
        cancel.add_argument("job", help="The job's id.")
        cancel.add_argument("--reason", default="", help="Recorded in the history.")
        retry = sub.add_parser(
            "retry", help="Queue a finished job again as a new, linked job; prints its id."
        )
        retry.add_argument("job", help="The job's id.")
        retry.add_argument("--reason", default="", help="Recorded in the history.")
        sub.add_parser("kinds", help="List the registered kinds and their options.")
        show = sub.add_parser(
            "show",
            help="Status, progress, attempts, watermarks, cancel and stop requests, related jobs (parent, "
            "retries, children) and history of a job.",
        )
        show.add_argument("job", help="The job's id.")
        show.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options)
        check_reason(options)
        action = options["action"]
        try:
            getattr(self, f"do_{action}")(options)
        except CommandError:
            raise
        except InvalidTransition as exc:
            raise CommandError(f"{action} refused: the job is {exc.current}; {REFUSED[action]}") from None
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
        job = services.request_cancel(get_job(options["job"]), cli_actor(), options["reason"])
        if job.status == Status.CANCELLED:
            self.stdout.write(f"cancelled {job.pk}")
        else:
            self.stdout.write(f"cancel requested for {job.pk}: its worker stops it at the next check")

    def do_retry(self, options: dict[str, Any]) -> None:
        try:
            new = services.retry(get_job(options["job"]), cli_actor(), options["reason"])
        except UnknownKind as exc:  # its handler removed since: no "kind" option to blame
            raise CommandError(f"retry: {exc.retry_refusal}") from None
        self.stdout.write(str(new.pk))

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
        job = get_job(options["job"])
        events = list(job.events.select_related("actor").order_by("-id")[:HISTORY_ROWS])[::-1]
        total = job.events.count()
        retries = [str(pk) for pk in job.retries.order_by("created_at").values_list("pk", flat=True)]
        children = job.children.order_by().count()
        if options["json"]:
            data = self._as_dict(job, events, total, retries, children)
            self.stdout.write(json.dumps(data, indent=2, cls=DjangoJSONEncoder))
            return
        w = self.stdout.write
        w(f"job        {job.pk}")
        w(f"kind       {job.kind}")
        status = Status(job.status).label if job.status in Status.values else job.status
        extra = " (cancel requested)" if job.cancel_requested_at and job.status != Status.CANCELLED else ""
        if job.stop_requested_at and job.status in ACTIVE:
            extra += " (stop requested)"
        w(f"status     {status}{extra}")
        w(f"owner      {job.owner.get_username() if job.owner else '-'}")
        progress = f"{job.progress}%" + (f"  {job.progress_message}" if job.progress_message else "")
        w(f"progress   {progress}" + (f"  [step {job.current_step}]" if job.current_step else ""))
        w(f"attempts   {job.attempts} of {job.max_attempts}")
        w(f"priority   {job.priority}" + (f"   key {job.key}" if job.key else ""))
        if marks := _watermarks(job):
            w(f"watermarks {marks}")
        w(f"created    {_when(job.created_at)}")
        if job.run_after and job.run_after > job.created_at and job.status == Status.QUEUED:
            w(f"run after  {_when(job.run_after)}")
        w(f"started    {_when(job.started_at)}")
        w(f"finished   {_when(job.finished_at)}")
        if job.cancel_requested_at:
            w(f"cancel     requested {_when(job.cancel_requested_at)}")
        if job.stop_requested_at:
            w(f"stop       requested {_when(job.stop_requested_at)}")
        if job.worker_id:
            w(f"worker     {job.worker_id}")
        if job.parent_id:
            w(f"parent     {job.parent_id}")
        if job.retry_of_id:
            w(f"retry of   {job.retry_of_id}")
        for pk in retries:
            w(f"retried as {pk}")
        if children:
            w(f"children   {children} job{'s' if children != 1 else ''}")
        if job.error_message:
            w(f"error      {job.error_type + ': ' if job.error_type else ''}{job.error_message}")
        if job.result not in (None, {}, []):
            w(f"result     {json.dumps(job.result, cls=DjangoJSONEncoder)[:500]}")
        w(
            f"history    ({total} transition{'s' if total != 1 else ''}"
            + (", latest shown)" if total > len(events) else ")")
        )
        for e in events:
            change = f"{e.from_status or '-'} -> {e.to_status}"
            reason = f"  {e.reason}" if e.reason else ""
            w(f"  {_when(e.created_at)}  {change:<24} {e.transition:<16} {e.actor_label}{reason}")

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

    @staticmethod
    def _as_dict(
        job: Job, events: list[Any], total: int, retries: list[str], children: int
    ) -> dict[str, Any]:
        """What the text shows: ``history`` holds the latest ``HISTORY_ROWS`` of
        ``history_total`` transitions; ``retried_as`` the jobs that retried this one,
        ``children`` how many child jobs it has."""
        return {
            "id": job.pk,
            "kind": job.kind,
            "status": job.status,
            "owner": job.owner.get_username() if job.owner else None,
            "progress": job.progress,
            "progress_message": job.progress_message,
            "current_step": job.current_step,
            "attempts": job.attempts,
            "max_attempts": job.max_attempts,
            "priority": job.priority,
            "key": job.key,
            "input_watermark": job.input_watermark,
            "claimed_watermark": job.claimed_watermark,
            "last_success_watermark": job.last_success_watermark,
            "created_at": job.created_at,
            "run_after": job.run_after,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "cancel_requested_at": job.cancel_requested_at,
            "stop_requested_at": job.stop_requested_at,
            "worker_id": job.worker_id,
            "parent": job.parent_id,
            "retry_of": job.retry_of_id,
            "retried_as": retries,
            "children": children,
            "error_type": job.error_type,
            "error_message": job.error_message,
            "result": job.result,
            "history_total": total,
            "history": [
                {
                    "at": e.created_at,
                    "from": e.from_status,
                    "to": e.to_status,
                    "transition": e.transition,
                    "actor": e.actor_label,
                    "reason": e.reason,
                }
                for e in events
            ],
        }


def _watermarks(job: Job) -> str:
    """``input 7  claimed 7  last success 6``: the watermarks that are set (0 is one)."""
    marks = (
        ("input", job.input_watermark),
        ("claimed", job.claimed_watermark),
        ("last success", job.last_success_watermark),
    )
    return "  ".join(f"{label} {value}" for label, value in marks if value is not None)


def _seconds(value: float) -> str:
    """``60s`` for 60 and 60.0, ``0.5s``: a whole number without its ``.0``."""
    return f"{int(value)}s" if float(value).is_integer() else f"{value}s"


def _when(moment: datetime | None) -> str:
    """In the current time zone; a naive time (``USE_TZ = False``) is so already."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return local.strftime("%Y-%m-%d %H:%M:%S")
