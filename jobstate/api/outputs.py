"""Read-only representations of jobs, their steps and events, the progress stream's
snapshots and stuck jobs; ``OutputSerializer``, the base of a model's (date-times in
the API's format).
"""

from __future__ import annotations

from typing import Any

from django.db import models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobstate.api.fields import UTCDateTimeField
from jobstate.api.permissions import OPERATOR, allowed_actions
from jobstate.models import Job, JobEvent, JobStep
from jobstate.models.step import SHOWN_STEP_STATUS, STEP_BUSY, shown_status
from jobstate.states import Status

ACTIONS = ("cancel", "retry", "requeue", "fail")


class OutputSerializer(serializers.ModelSerializer[Any]):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DateTimeField: UTCDateTimeField,
    }


# A step as ``jobstate.workflows.state`` shows it: still busy in a job that ended, it
# is ``interrupted``, its stored status in ``stored_status``. (Its job is the
# prefetched or related-manager instance: no query per step.) The docstring is the
# schema component's description.
class StepSerializer(OutputSerializer):
    """A step of a workflow job, in order: its status (`interrupted` when it was in
    progress as its job ended), attempts, output, error and times."""

    status = serializers.SerializerMethodField(
        help_text="`interrupted`: the step was in progress when its job ended (cancelled or failed)."
    )
    stored_status = serializers.SerializerMethodField(
        help_text="The stored status of an `interrupted` step (null otherwise)."
    )

    class Meta:
        model = JobStep
        fields = [
            "position",
            "name",
            "status",
            "stored_status",
            "attempts",
            "cursor",
            "output",
            "error_message",
            "started_at",
            "finished_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=SHOWN_STEP_STATUS))
    def get_status(self, step: JobStep) -> str:
        return shown_status(step.status, step.job.status)

    @extend_schema_field(serializers.ChoiceField(choices=[str(s) for s in STEP_BUSY], allow_null=True))
    def get_stored_status(self, step: JobStep) -> str | None:
        return None if self.get_status(step) == step.status else str(step.status)


class JobSerializer(OutputSerializer):
    owner = serializers.SerializerMethodField()
    allowed_actions = serializers.SerializerMethodField(
        help_text="What the caller may do to this job now (cancel while it is active, retry once it ended)."
    )
    cancel_requested = serializers.SerializerMethodField()
    status = serializers.ChoiceField(choices=Status.choices, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "kind",
            "status",
            "progress",
            "progress_message",
            "current_step",
            "key",
            "priority",
            "attempts",
            "max_attempts",
            "owner",
            "parent",
            "retry_of",
            "error_message",
            "error_type",
            "cancel_requested",
            "run_after",
            "created_at",
            "updated_at",
            "started_at",
            "finished_at",
            "allowed_actions",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "started_at": {
                "help_text": "When its last run started (null until it first runs): a job run again "
                "(another attempt, a workflow resumed once its children ended) has the latest start."
            },
        }

    def get_owner(self, job: Job) -> str | None:
        return job.owner.get_username() if job.owner_id is not None and job.owner else None

    @extend_schema_field({"type": "array", "items": {"type": "string", "enum": list(ACTIONS)}})
    def get_allowed_actions(self, job: Job) -> list[str]:
        return allowed_actions(self.context["request"].user, job)

    def get_cancel_requested(self, job: Job) -> bool:
        return job.cancel_requested_at is not None


class JobDetailSerializer(JobSerializer):
    parameters = serializers.JSONField(read_only=True)
    result = serializers.JSONField(read_only=True, allow_null=True)
    steps = StepSerializer(many=True, read_only=True)
    duration = serializers.SerializerMethodField(
        help_text="Seconds since its last run started (`started_at`), until it ended."
    )

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "parameters",
            "result",
            "input_watermark",
            "last_success_watermark",
            "cancel_requested_at",
            "stop_requested_at",
            "heartbeat_at",
            "duration",
            "steps",
        ]
        read_only_fields = fields

    def get_duration(self, job: Job) -> float | None:
        duration = job.duration
        return None if duration is None else round(duration.total_seconds(), 3)


class JobEventSerializer(OutputSerializer):
    from_status = serializers.SerializerMethodField(help_text="Empty for the enqueue event.")
    actor = serializers.CharField(
        source="actor_label", read_only=True, help_text="api, admin, worker:<id>, …"
    )
    user = serializers.SerializerMethodField(
        help_text="The user behind the change, if any: `operator` for someone other than you, unless you "
        "may view all jobs."
    )
    metadata = serializers.SerializerMethodField()

    class Meta:
        model = JobEvent
        fields = [
            "id",
            "from_status",
            "to_status",
            "transition",
            "actor",
            "user",
            "reason",
            "metadata",
            "created_at",
        ]
        read_only_fields = fields

    def get_from_status(self, event: JobEvent) -> str | None:
        return event.from_status or None

    def get_user(self, event: JobEvent) -> str | None:
        if event.actor_id is None or not event.actor:
            return None
        if self._names_user(event):
            return event.actor.get_username()
        return OPERATOR

    def to_representation(self, event: JobEvent) -> dict[str, Any]:
        data = super().to_representation(event)
        # "user:<name>" labels (changes made in code on a user's behalf) name a person too.
        label = data.get("actor") or ""
        if label.startswith("user:") and not self._names_user(event):
            data["actor"] = f"user:{OPERATOR}"
        return data

    def _names_user(self, event: JobEvent) -> bool:
        """Usernames are shown to those who may view all jobs; others see their own."""
        if self.context.get("names_users"):
            return True
        request = self.context.get("request")
        viewer = getattr(getattr(request, "user", None), "pk", None)
        return viewer is not None and event.actor_id == viewer

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_metadata(self, event: JobEvent) -> dict[str, Any]:
        # Tracebacks stay in the admin: they describe the server, not the job.
        return {k: v for k, v in (event.metadata or {}).items() if k != "traceback"}


class JobSnapshotSerializer(serializers.Serializer[Any]):
    """What the progress stream sends each time the job changes."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.choices)
    progress = serializers.IntegerField()
    progress_message = serializers.CharField()
    current_step = serializers.CharField()
    cancel_requested = serializers.BooleanField()
    error_message = serializers.CharField()
    updated_at = UTCDateTimeField()
    finished_at = UTCDateTimeField(allow_null=True)


# A finding of jobstate.stuck.
class StuckSerializer(serializers.Serializer[Any]):
    """A job that needs a person: why, since when and what fixes it."""

    job = serializers.UUIDField()
    kind = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    reason = serializers.CharField(help_text="Reason code, e.g. `lease_expired`.")
    title = serializers.CharField()
    text = serializers.CharField()
    remedy = serializers.CharField(
        help_text="`requeue`, `force_cancel`, `retry`, `start_worker` or `resume_kind`."
    )
    remedy_text = serializers.CharField()
    since = UTCDateTimeField(allow_null=True)
