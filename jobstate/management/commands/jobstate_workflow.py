"""Workflows from the command line: start one, show its state, retry it from a
step, skip a step, ask a serving one to stop (one that never served is
cancelled). Actions record the actor ``cli:<user>`` and the reason."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from jobstate import services
from jobstate.exceptions import InvalidTransition, JobStateError
from jobstate.management.commands._common import (
    PipedCommand,
    check_reason,
    check_text,
    cli_actor,
    fail,
    get_job,
    json_object,
    options_after_subcommands,
)
from jobstate.models import Job, JobStep
from jobstate.states import TERMINAL, Status
from jobstate.workflows import definition_of, retry_from, skip_step, state

# What to do instead, after the refusal of retry_from or skip_step (InvalidTransition.refusal).
INSTEAD = {"skip": " (of a finished one: retry --from STEP --skip STEP)"}


class Command(PipedCommand):
    help = (
        "Start a workflow, show its state, retry it from a step, skip a step, or stop a serving one "
        "(one that never served is cancelled)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="Queue a workflow job.")
        start.add_argument("kind", help="A registered workflow kind (see `jobstate kinds`).")
        start.add_argument("--params", default="{}", help="Parameters as a JSON object.")
        show = sub.add_parser("state", help="Print the workflow state as JSON.")
        show.add_argument("job", help="The job's id.")
        retry = sub.add_parser("retry", help="Retry a finished workflow as a new linked job.")
        retry.add_argument("job", help="The finished workflow job's id.")
        retry.add_argument("--from", dest="step", help="First step to run again (default: where it stopped).")
        retry.add_argument("--skip", action="append", default=[], help="Step to skip (repeatable).")
        retry.add_argument("--reason", default="", help="Recorded in the history.")
        skip = sub.add_parser(
            "skip", help="Skip a failed or pending step of a queued or waiting workflow job."
        )
        skip.add_argument("job", help="The job's id.")
        skip.add_argument("step", help="The name of the step to skip.")
        skip.add_argument("--reason", default="", help="Recorded in the history and on the step.")
        stop = sub.add_parser(
            "stop",
            help="Ask a serving job (running, or queued or waiting after it served) to stop gracefully: "
            "it ends completed. A queued or waiting job that never served is cancelled instead, with its "
            "active children.",
        )
        stop.add_argument("job", help="The job's id.")
        stop.add_argument("--reason", default="", help="Recorded in the history.")
        options_after_subcommands(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options)
        check_reason(options)
        actor = cli_actor()
        action = options["action"]
        try:
            if action == "start":
                if definition_of(options["kind"]) is None:
                    raise CommandError(f"'{options['kind']}' is not a registered workflow")
                params = json_object(options["params"])
                job = services.enqueue(options["kind"], params, actor=actor, reason="started from the CLI")
                self.stdout.write(str(job.pk))
                return
            job = get_job(options["job"])
            if action == "state":
                if definition_of(job.kind) is None and not JobStep.objects.filter(job_id=job.pk).exists():
                    raise CommandError(
                        f"Job {job.pk} ({job.kind}) is not a workflow; "
                        f"`manage.py jobstate show {job.pk}` shows it"
                    )
                self.write_long(json.dumps(state(job), indent=2))
            elif action == "retry":
                new = retry_from(
                    job, options["step"], actor=actor, reason=options["reason"], skip=options["skip"]
                )
                self.stdout.write(str(new.pk))
            elif action == "skip":
                skip_step(job, options["step"], actor=actor, reason=options["reason"])
                self.stdout.write(f"skipped {options['step']} of {job.pk}")
            elif action == "stop":
                try:
                    stopped = services.request_stop(job, actor, options["reason"])
                except InvalidTransition as exc:
                    if exc.current not in TERMINAL:
                        raise
                    raise CommandError(f"stop refused: job {job.pk} has ended ({exc.current})") from None
                if stopped.status == Status.CANCELLED:  # queued, it had never served: nothing to stop
                    self.stdout.write(f"cancelled {job.pk}: it had not served yet")
                else:
                    self.stdout.write(f"stop requested for {job.pk}")
        except InvalidTransition as exc:  # "Cannot move job from 'processing' to 'queued' (retry_from)"
            if action not in ("retry", "skip"):
                raise fail(exc) from None
            raise CommandError(f"{action} refused: {exc.refusal}{INSTEAD.get(action, '')}") from None
        except (ValidationError, JobStateError, ValueError, Job.DoesNotExist) as exc:  # deleted meanwhile
            raise fail(exc) from None
