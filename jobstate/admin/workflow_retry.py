"""The admin's Retry of a workflow job: from its first step (``services.retry``,
every step runs again) or from a later one (``retry_from``, as
``jobstate_workflow retry --from STEP``: the steps before it are copied)."""

from __future__ import annotations

from typing import Any

from django import forms

from jobstate.models import Job, JobStep
from jobstate.models.step import STEP_DONE
from jobstate.services import Actor
from jobstate.workflows.definition import definition_of
from jobstate.workflows.operators import retry_from


def retry_steps(job: Job) -> list[str] | None:
    """The steps a retry of ``job`` may start at, first step first (each after
    steps that all completed or were skipped: ``retry_from``'s rule); None when
    ``job`` is no workflow."""
    cls = definition_of(job.kind)
    if cls is None:
        return None
    status = dict(JobStep.objects.filter(job_id=job.pk).values_list("name", "status"))
    steps: list[str] = []
    for spec in cls.steps:
        steps.append(spec.name)
        if status.get(spec.name) not in STEP_DONE:
            break
    return steps


def from_step_field(steps: list[str]) -> forms.ChoiceField:
    first = [("", f"{steps[0]}, its first step: every step runs again")]
    later = [
        (name, f"{name}: the steps before it are copied with their outputs, not run") for name in steps[1:]
    ]
    return forms.ChoiceField(
        label="Run again from",
        choices=first + later,
        required=False,
        help_text="A later step keeps the work (and side effects) of the completed steps before it.",
    )


def note(steps: list[str]) -> str:
    """What the confirmation page says of a workflow's retry."""
    text = (
        "This job is a workflow: a retry runs it again from its first step, so the side effects of "
        "its completed steps happen again."
    )
    if len(steps) > 1:
        text += " To keep them, run it again from a later step below."
    return text


def retry_from_step(job: Job, user: Any, reason: str, step: str) -> Job:
    return retry_from(job, step, actor=Actor.admin(user), reason=reason)
