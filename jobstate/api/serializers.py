"""Representations of jobs, steps, events and assets, and the API's inputs.

Output serializers are read-only views of rows; input serializers only shape
and bound the request (strict JSON types, sizes). Everything about whether a
job may be created or moved is decided by jobstate.services.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from django.conf import settings
from django.db import models
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.settings import api_settings

from jobstate import conf
from jobstate.api.permissions import OPERATOR, allowed_actions
from jobstate.api.times import as_stored
from jobstate.models import Asset, Job, JobEvent, JobStep
from jobstate.models.step import SHOWN_STEP_STATUS, STEP_BUSY, shown_status
from jobstate.states import Status
from jobstate.storable import MAX_DEPTH, too_deep

ACTIONS = ("cancel", "retry", "requeue", "fail")
BIGINT = 2**63


# Strict inputs --------------------------------------------------------------


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise serializers.ValidationError("Null characters are not allowed.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("Text must be valid Unicode.") from None
    return value


class UTCDateTimeField(serializers.DateTimeField):
    """ISO 8601 in UTC ("…Z"), whatever the active time zone: instants, the same
    for every client. Also skips DRF's per-value time-zone lookup, which is a
    good part of a 50-row page's serialization time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The API's format, not the project's REST_FRAMEWORK["DATETIME_FORMAT"].
        kwargs.setdefault("format", ISO_8601)
        super().__init__(*args, **kwargs)

    # DRF's own returns None for an empty value too (its stub says str).
    def to_representation(self, value: Any) -> str | None:  # type: ignore[override]
        if not value:
            return None
        output_format = getattr(self, "format", api_settings.DATETIME_FORMAT)
        iso = isinstance(output_format, str) and output_format.lower() == ISO_8601
        if isinstance(value, datetime) and value.tzinfo is None and not settings.USE_TZ:
            value = timezone.make_aware(value, timezone.get_default_timezone())  # as Django stores it then
        if iso and isinstance(value, datetime) and value.tzinfo is not None:
            text = value.astimezone(UTC).isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return super().to_representation(value)


class AwareDateTimeField(serializers.DateTimeField):
    """An input time kept timezone-aware (a naive one is read in the current time zone),
    as the services take it, with ``USE_TZ = False`` too: DRF made it naive then, and
    the service refused it."""

    def default_timezone(self) -> tzinfo:
        return timezone.get_current_timezone()

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            return super().enforce_timezone(value)
        except OverflowError:
            # DRF's check of a naive time at the calendar's edge converts it to UTC
            # (9999-12-31T23:59 in New York): its "overflow" error, not a 500.
            self.fail("overflow")


class StoredDateTimeField(AwareDateTimeField):
    """An input time to compare with stored ones (``as_stored``): with ``USE_TZ = False``
    DRF made it naive in UTC, hours off the times Django stores then (in ``TIME_ZONE``)."""

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            return as_stored(super().enforce_timezone(value))
        except OverflowError:
            self.fail("overflow")


class StrictCharField(serializers.CharField):
    """A string, and only a string (DRF's CharField would accept numbers)."""

    # Its own key: a subclass's "invalid" (a URL's) is another message.
    default_error_messages = {"not_a_string": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return _check_text(super().to_internal_value(data))


class StrictURLField(StrictCharField, serializers.URLField):
    """A URL, given as a string."""


class StrictChoiceField(serializers.ChoiceField):
    """One of the string choices, given as a string (DRF's compares ``str(data)``).
    Text checked first: DRF's refusal repeats the value, and a lone surrogate in
    the error made the response a 500 (JSON cannot encode it)."""

    default_error_messages = {"not_a_string": "Not a valid string."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(_check_text(data))


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean (DRF's BooleanField would accept "yes", "on", "1", 1 and 0)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer (not a string, a float or a boolean)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "additionalProperties": True})
class ParametersField(serializers.Field[Any, Any, Any, Any]):
    """A JSON object: only size and plain-text checks here; the handler's schema
    validates the content (in jobstate.services)."""

    default_error_messages = {
        "not_object": "Parameters must be a JSON object.",
        "too_large": "Parameters are {size} bytes; the limit is {limit}.",
        "too_deep": f"Parameters are nested more than {MAX_DEPTH} levels deep.",
    }

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("not_object")
        try:
            encoded = json.dumps(data, separators=(",", ":"))
        except RecursionError:
            self.fail("too_deep")
        size = len(encoded.encode())
        limit = conf.get("MAX_PARAMETERS_BYTES")
        if size > limit:
            self.fail("too_large", size=size, limit=limit)
        if too_deep(encoded):  # after the size: its cost grows with the text
            self.fail("too_deep")
        _check_tree(data)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


def _check_tree(value: Any) -> None:
    """PostgreSQL refuses NUL characters and lone surrogates in JSON text: say so
    as a 400 instead of failing in the database."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for k, v in item.items():
                _check_text(k)
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


class StrictInput(serializers.Serializer[Any]):
    """The base of every request body's serializer (before ``OutputSerializer`` for
    a model's): a body field it does not take is refused, a 400 ``invalid`` naming
    each one in ``fields`` ("Unknown field.", or "This field is read-only." for one
    it shows but does not take, e.g. an ``id`` echoed from a GET), with the body's
    other field errors; nothing is written. A misspelt field (``"parmeters"``) was
    ignored: the job ran with the defaults and the client never learnt of the typo.
    The schema says so too (``additionalProperties: false``, jobstate.api.schema)."""

    default_error_messages = {
        "unknown_field": "Unknown field.",
        "read_only_field": "This field is read-only.",
    }

    def to_internal_value(self, data: Any) -> Any:
        refused = self.refused_fields(data)
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if refused and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**refused, **exc.detail}) from None
            raise
        if refused:
            raise serializers.ValidationError(refused)
        return value

    def refused_fields(self, data: Any) -> dict[str, list[ErrorDetail]]:
        """The body's fields this serializer does not take, each with its message, in
        the body's order (first: a misspelt field is also why a required one is missing)."""
        if not isinstance(data, Mapping):
            return {}  # DRF's own error: not a JSON object
        fields = self.fields
        refused = {}
        for name in data:
            field = fields.get(name)
            if field is not None and not field.read_only:
                continue
            code = "unknown_field" if field is None else "read_only_field"
            refused[_printable(name)] = [ErrorDetail(str(self.error_messages[code]), code=code)]
        return refused


def _printable(name: Any) -> str:
    """A field name as the error can show it: a lone surrogate (valid in a JSON
    string) escaped, or the JSON renderer could not encode the response (a 500)."""
    return str(name).encode("utf-8", "backslashreplace").decode("utf-8")


class EnqueueSerializer(StrictInput):
    kind = StrictCharField(max_length=200, help_text="A registered handler name.")
    parameters = ParametersField(required=False, default=dict, help_text="Validated by the handler's schema.")
    key = StrictCharField(
        max_length=255,
        required=False,
        allow_null=True,
        default=None,
        # Taken as sent: stripped, " a" and "a" named one job. The service refuses a blank key.
        trim_whitespace=False,
        help_text="Idempotency key: an active (or still up to date) job of yours with this kind and key is "
        "returned with 200 instead of queueing a new one. Taken as sent (surrounding spaces are part "
        "of it); a key of only whitespace is refused.",
    )
    watermark = StrictIntegerField(
        min_value=-BIGINT,
        max_value=BIGINT - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text="Input version for keyed jobs; a newer watermark re-runs a finished job.",
    )
    priority = StrictIntegerField(min_value=-32768, max_value=32767, required=False, default=0)
    run_after = AwareDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        input_formats=[ISO_8601],
        help_text="Do not start before this time (ISO 8601).",
    )


class ReasonSerializer(StrictInput):
    reason = StrictCharField(max_length=1000, required=False, allow_blank=True, default="")


class RequiredReasonSerializer(StrictInput):
    reason = StrictCharField(max_length=1000, help_text="Why: recorded in the history.")


class StuckSerializer(serializers.Serializer[Any]):
    """A job that needs a person (jobstate.stuck): why, since when, what fixes it."""

    job = serializers.UUIDField()
    kind = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    reason = serializers.CharField(help_text="Reason code, e.g. `lease_expired`.")
    title = serializers.CharField()
    text = serializers.CharField()
    remedy = serializers.CharField(help_text="`requeue`, `force_cancel`, `retry` or `start_worker`.")
    remedy_text = serializers.CharField()
    since = UTCDateTimeField(allow_null=True)


# Outputs --------------------------------------------------------------------


class OutputSerializer(serializers.ModelSerializer[Any]):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DateTimeField: UTCDateTimeField,
    }


class StepSerializer(OutputSerializer):
    """A step as ``jobstate.workflows.state`` shows it: still busy in a job that ended,
    it is ``interrupted``, its stored status in ``stored_status``. (Its job is the
    prefetched or related-manager instance: no query per step.)"""

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
    duration = serializers.SerializerMethodField(help_text="Seconds since it started (until it ended).")

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


class AssetSerializer(OutputSerializer):
    url = serializers.SerializerMethodField(help_text="External location, for assets stored elsewhere.")
    download_url = serializers.SerializerMethodField(help_text="Streams the file (or redirects to `url`).")

    class Meta:
        model = Asset
        fields = [
            "id",
            "job",
            "asset_type",
            "name",
            "content_type",
            "size",
            "sha256",
            "metadata",
            "url",
            "download_url",
            "created_at",
        ]
        read_only_fields = fields

    def get_url(self, asset: Asset) -> str | None:
        # Only http(s): javascript: or data: would run in a client showing the link.
        return asset.web_url or None

    @extend_schema_field({"type": "string", "format": "uri"})
    def get_download_url(self, asset: Asset) -> str:
        try:
            path = reverse("jobstate-api:asset-download", kwargs={"pk": asset.pk})
        except NoReverseMatch:  # mounted without the namespace
            path = reverse("asset-download", kwargs={"pk": asset.pk})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


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


class ErrorDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `invalid_transition`.")
    message = serializers.CharField()
    # A declared field: DRF's metaclass takes it out of the class, Serializer.fields stays.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.JSONField(), help_text="Field name to messages (nested for `parameters`)."
    )
    current_status = serializers.ChoiceField(
        choices=Status.choices, required=False, help_text="The job's status, for a refused transition."
    )


class ErrorSerializer(serializers.Serializer[Any]):
    error = ErrorDetailSerializer()
