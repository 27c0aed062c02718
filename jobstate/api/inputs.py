"""The API's request bodies: ``StrictInput`` (every body's base: an unknown field
is refused) and the job actions' inputs (enqueue, reasons).

They only shape and bound the request; whether a job may be created or moved is
decided by jobstate.services.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import ISO_8601, serializers
from rest_framework.exceptions import ErrorDetail

from jobstate import conf
from jobstate.api.fields import AwareDateTimeField, ParametersField, StrictCharField, StrictIntegerField
from jobstate.parameter_keys import printable

BIGINT = 2**63


# A serializer's docstring is its schema component's description (Swagger UI shows
# it), and drf-spectacular takes the nearest one in its bases: each body says what it
# is to a client in its own, and this base has comments only.
#
# The base of every request body's serializer (before ``OutputSerializer`` for a
# model's): a body field it does not take is refused, a 400 ``invalid`` naming each
# one in ``fields`` ("Unknown field.", or "This field is read-only." for one it shows
# but does not take, e.g. an ``id`` echoed from a GET), with the body's other field
# errors; nothing is written. A misspelt field (``"parmeters"``) was ignored: the job
# ran with the defaults and the client never learnt of the typo. The schema says so
# too (``additionalProperties: false``, jobstate.api.schema).
class StrictInput(serializers.Serializer[Any]):
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
            refused[printable(name)] = [ErrorDetail(str(self.error_messages[code]), code=code)]
        return refused


class EnqueueSerializer(StrictInput):
    """A job to queue: the kind of work and its parameters; optionally an idempotency
    key, a watermark, a priority and a time to start after. A field not listed here
    is refused (400 `invalid`)."""

    kind = StrictCharField(
        max_length=200,
        # Taken as sent, as the registry looks it up: stripped, " a" queued an "a" job
        # that services.enqueue(" a") and `jobstate enqueue " a"` refuse as unknown.
        trim_whitespace=False,
        help_text="A registered handler name, exactly (surrounding whitespace makes it an unknown kind).",
    )
    parameters = ParametersField(required=False, default=dict, help_text="Validated by the handler's schema.")
    key = StrictCharField(
        max_length=255,
        required=False,
        allow_null=True,
        default=None,
        # Taken as sent: stripped, " a" and "a" named one job. The service refuses a blank key.
        trim_whitespace=False,
        help_text="Idempotency key: an active (or still up to date) job of yours with this kind and key is "
        "returned with 200 (`Idempotent-Replayed: true`) instead of queueing a new one; if it was enqueued "
        "with other parameters or another priority, a 422 `idempotency_key_reused`. Taken as sent "
        "(surrounding spaces are part of it); a key of only whitespace is refused.",
    )
    watermark = StrictIntegerField(
        min_value=-BIGINT,
        max_value=BIGINT - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text="Input version for keyed jobs; a newer watermark re-runs a finished job.",
    )
    priority = StrictIntegerField(
        min_value=conf.PRIORITY_RANGE[0],
        max_value=conf.PRIORITY_RANGE[1],
        required=False,
        default=0,
        help_text="Higher runs first; a negative one runs later. At most the server's "
        '`JOBSTATE["API_MAX_PRIORITY"]` (0 unless set) unless you are staff with `jobstate.change_job`.',
    )
    run_after = AwareDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        input_formats=[ISO_8601],
        help_text="Do not start before this time (ISO 8601).",
    )

    def validate_priority(self, value: int) -> int:
        # The view passes the caller's cap (``max_priority``; None: the column's range);
        # without one, the setting's.
        cap = self.context["max_priority"] if "max_priority" in self.context else conf.get("API_MAX_PRIORITY")
        if cap is not None and value > cap:
            raise serializers.ValidationError(
                f"Ensure this value is less than or equal to {cap}: the highest priority you may set "
                "through the API.",
                code="max_value",
            )
        return value


class ReasonSerializer(StrictInput):
    """An optional reason, recorded in the job's history."""

    reason = StrictCharField(max_length=1000, required=False, allow_blank=True, default="")


class RetrySerializer(ReasonSerializer):
    """A retry's reason and, for a workflow job, the step to run again from."""

    from_step = StrictCharField(
        max_length=200,
        required=False,
        allow_null=True,
        default=None,
        help_text="A workflow job only: the first step to run again; the steps before it are copied "
        "with their outputs, not run (as `jobstate_workflow retry --from STEP`). Each of them must "
        "have completed or been skipped. Without it a workflow runs again from its first step.",
    )


class RequiredReasonSerializer(StrictInput):
    """A reason, required: recorded in the job's history."""

    reason = StrictCharField(max_length=1000, help_text="Why: recorded in the history.")
