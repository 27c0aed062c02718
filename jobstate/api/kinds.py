"""``GET /api/kinds/``: the kinds the caller may start, with their parameters.

Only kinds whose ``api=`` policy lets the caller enqueue them are listed (see
``jobstate.api.permissions.may_start``); ``POST /jobs/`` answers any other kind
as it answers one not registered (a 400 ``unknown_kind``), so the two agree on
what exists for the caller. Each says whether an operator paused it, and since when
(``jobstate.api.pauses``): the caller's jobs of it wait until it is resumed.
"""

from __future__ import annotations

import logging
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry
from rest_framework import serializers
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from jobstate import services
from jobstate.api.base import JobstateAPIView
from jobstate.api.fields import UTCDateTimeField
from jobstate.api.pauses import pause_fields
from jobstate.api.permissions import may_view_all, startable_kinds
from jobstate.api.schema import extend_schema
from jobstate.registry import HandlerSpec, _is_serializer_class

logger = logging.getLogger("jobstate.api")

ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}


class KindSerializer(serializers.Serializer[Any]):
    kind = serializers.CharField(help_text="The name to send as `kind` in `POST /jobs/`.")
    # jobstate.registry.summary: reStructuredText roles, inline literals and Markdown
    # code spans unwrapped.
    description = serializers.CharField(
        help_text="What the kind does: the first paragraph of its handler's docstring, as plain text."
    )
    workflow = serializers.BooleanField(help_text="A multi-step workflow (`jobstate.workflow`).")
    max_attempts = serializers.IntegerField(allow_null=True, help_text="Null: the server's default.")
    timeout = serializers.FloatField(allow_null=True, help_text="Seconds per attempt; null: the default.")
    parameters = serializers.DictField(
        help_text="OpenAPI 3.0 schema of `parameters` (nested objects under `$defs`); "
        "an open object when the handler validates them in code or not at all."
    )
    paused = serializers.BooleanField(
        help_text="An operator paused the kind: no worker starts its queued jobs (yours too) until it is "
        "resumed. Enqueue still accepts new ones; they wait with the others."
    )
    paused_since = UTCDateTimeField(allow_null=True, help_text="When it was paused; null: not paused.")
    pause_reason = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="Why it was paused (null: not paused). "
        "Only to staff with `jobstate.view_job` (or `change_job`).",
    )
    paused_by = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="Who paused it, as `api (alice)` (null: not paused). "
        "Only to staff with `jobstate.view_job` (or `change_job`).",
    )


def parameters_schema(spec: HandlerSpec) -> dict[str, Any]:
    """The OpenAPI schema of the kind's parameters, as /api/schema/ would write it."""
    if spec.schema is None:
        return dict(ANY_OBJECT)
    if not _is_serializer_class(spec.schema):
        return {**ANY_OBJECT, "description": "Validated by the handler."}
    try:
        return _serializer_schema(spec.schema)
    except Exception:  # an exotic field must not break the list
        logger.warning("No parameter schema for kind %s", spec.name, exc_info=True)
        return {**ANY_OBJECT, "description": "Validated by the handler."}


def _serializer_schema(serializer_class: type[serializers.BaseSerializer[Any]]) -> dict[str, Any]:
    view: GenericAPIView[Any] = GenericAPIView()
    view.request = None  # type: ignore[assignment]
    view.format_kwarg = None
    generator = AutoSchema()
    generator.registry = ComponentRegistry()
    generator.method, generator.path, generator.view = "POST", "/jobs/", view
    schema = generator._map_serializer(serializer_class(), "request")
    defs = {name: component.schema for (name, _), component in generator.registry._components.items()}
    # enqueue refuses a key no field takes (jobstate.parameter_keys), at every depth.
    for closed in (schema, *defs.values()):
        if closed.get("type") == "object":  # a DictField's schema names its own
            closed.setdefault("additionalProperties", False)
    if defs:
        schema = {**schema, "$defs": defs}
    tidy: dict[str, Any] = _tidy(schema)
    return tidy


def _tidy(value: Any) -> Any:
    """Local references, and no drf-spectacular bookkeeping keys."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key.startswith("x-spec-"):
                continue
            if key == "$ref" and isinstance(item, str):
                item = item.replace("#/components/schemas/", "#/$defs/")
            out[key] = _tidy(item)
        return out
    if isinstance(value, list):
        return [_tidy(item) for item in value]
    return value


def describe(spec: HandlerSpec) -> dict[str, Any]:
    return {
        "kind": spec.name,
        "description": spec.description,
        "workflow": spec.options.get("workflow") is not None,
        "max_attempts": spec.max_attempts,
        "timeout": spec.timeout,
        "parameters": parameters_schema(spec),
    }


class KindList(JobstateAPIView):
    """The job kinds you may start through the API."""

    @extend_schema(
        summary="Kinds you may start",
        description="Every kind whose API policy lets you enqueue it, by name, with the schema of its "
        "parameters. Any other kind, registered or not, is an unknown kind to you: enqueueing it is a 400 "
        "`unknown_kind`. Each says whether an operator paused it (`paused`, `paused_since`): its queued "
        "jobs then wait until it is resumed.",
        responses=KindSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        pauses = {pause.kind: pause for pause in services.paused_kinds()}
        names_people = may_view_all(request.user)
        return Response(
            [
                describe(spec) | pause_fields(pauses.get(spec.name), names_people)
                for spec in startable_kinds(request.user)
            ]
        )
