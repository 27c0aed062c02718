"""OpenAPI (drf-spectacular): every operation documents the error responses it
can give, all in the one error shape, so schema-driven clients and tests know
them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, cast

from django.apps import apps
from django.templatetags.static import static
from django.views import View
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.utils import extend_schema as spectacular_extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import APIException
from rest_framework.metadata import SimpleMetadata
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

import jobstate
from jobstate.api.errors import ErrorSerializer, exception_handler
from jobstate.api.inputs import StrictInput
from jobstate.api.negotiation import FormatNegotiation
from jobstate.api.throttling import JobstateThrottle

# One Server-Sent Event, as OpenAPI describes an event stream's items. ``data``
# is JSON: a job snapshot for ``job``, {"reason", "status"?} for ``end``, the
# error shape for ``error``.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["job", "end", "error"]},
        "data": {"type": "string", "description": "JSON"},
        "id": {
            "type": "string",
            "description": "The job's updated_at, '/' and a digest of the event's data "
            "(send back as Last-Event-ID).",
        },
        "retry": {"type": "integer", "minimum": 0},
    },
}

DESCRIPTIONS = {
    "400": "Invalid input (see `error.fields`).",
    "401": "Not authenticated.",
    "403": "Authenticated, but not allowed.",
    "404": "Not found (or not yours).",
    "405": "Method not allowed.",
    "406": "Cannot produce the requested media type.",
    "409": "Conflict (see `error.code`): a job's current state (`invalid_transition`, with "
    "`error.current_status`), a job retried already (`already_retried`, with `error.retry_id`), an "
    "idempotency key's active job (`duplicate_active_key`), a kind already paused or not paused "
    "(`pause_refused`), …",
    "413": "Request body too large.",
    "415": "Unsupported media type (send JSON).",
    "429": "Throttled; retry after `Retry-After` seconds.",
    "503": "The database is busy with other writes (`database_busy`) or its connection failed "
    "(`database_unavailable`); retry after `Retry-After` seconds.",
}

# The headers every response of these codes carries (``errors.exception_handler``
# sets Retry-After; each create answers the new object's URL).
HEADERS: dict[str, dict[str, Any]] = {
    "201": {
        "Location": {
            "schema": {"type": "string", "format": "uri"},
            "required": True,
            "description": "The URL of what was created.",
        }
    },
    "429": {
        "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before trying again."}
    },
    "503": {
        "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before trying again."}
    },
}


def extend_schema(**kwargs: Any) -> Callable[[Any], Any]:
    """drf-spectacular's ``extend_schema`` for jobstate's view methods, built on
    ``JobstateAutoSchema`` whatever the project's ``DEFAULT_SCHEMA_CLASS``.

    drf-spectacular bases a method's extended schema on the method's own
    ``kwargs["schema"]`` or else on ``DEFAULT_SCHEMA_CLASS`` as it was at import
    time; with DRF's (the default) ``/api/schema/`` would fail. Setting ours
    first makes the annotation independent of the host's settings.
    """
    decorate = spectacular_extend_schema(**kwargs)

    def decorator(f: Any) -> Any:
        if callable(f) and not inspect.isclass(f) and not hasattr(f, "cls"):
            if not hasattr(f, "kwargs"):
                f.kwargs = {}
            f.kwargs.setdefault("schema", JobstateAutoSchema)
        return decorate(f)

    return decorator


class JobstateAutoSchema(AutoSchema):
    def _map_serializer(
        self, serializer: Any, direction: Any, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_serializer(serializer, direction, bypass_extensions)
        if isinstance(serializer, StrictInput) and "properties" in schema:
            # A body field the serializer does not take is a 400 (StrictInput): say so,
            # so that generated clients and tests send none. Its component is the
            # response's too (no COMPONENT_SPLIT_REQUEST), which shows nothing else either.
            schema["additionalProperties"] = False
        return schema

    def _get_response_headers_for_code(self, status_code: Any, direction: Any = "response") -> dict[str, Any]:
        headers: dict[str, Any] = super()._get_response_headers_for_code(status_code, direction)
        code = str(status_code)
        if code in HEADERS and direction == "response":
            headers = {**HEADERS[code], **headers}
        return headers

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        codes = ["400", "401", "403", "405", "406", "429", "503"]
        if "{" in self.path:
            codes.append("404")
        if self.method in ("POST", "PUT", "PATCH"):
            codes += ["413", "415"]
            codes.append("409")
        # Errors are JSON, or one ``error`` event for a client of the event stream.
        streams = "text/event-stream" in self.map_renderers("media_type")
        for code in codes:
            if code not in responses:
                body = self._get_response_for_code(ErrorSerializer, code, ["application/json"], direction)
                if streams:
                    body["content"]["text/event-stream"] = {"schema": SSE_EVENT_SCHEMA}
                body["description"] = DESCRIPTIONS[code]
                responses[code] = body
        return responses


# The schema and docs of the jobstate API alone, whatever the project's settings -------


def _is_jobstate_view(callback: Any) -> bool:
    cls = getattr(callback, "cls", None)
    return cls is not None and cls.__module__.startswith("jobstate.") and not issubclass(cls, _OwnViews)


class JobstateSchemaGenerator(SchemaGenerator):
    """Documents jobstate's endpoints (wherever the project mounts them) and
    nothing else: other views may carry schema classes drf-spectacular refuses
    (e.g. under DRF's default ``DEFAULT_SCHEMA_CLASS``)."""

    def _initialise_endpoints(self) -> None:
        if self.endpoints is None:
            super()._initialise_endpoints()
            endpoints = cast("Sequence[Any]", self.endpoints)  # set by the call above
            self.endpoints = [e for e in endpoints if _is_jobstate_view(e[3])]


# The two ``status`` choice sets of the API, by name (see JobstateSchemaView).
# A step's shows ``interrupted`` too (``models.step.shown_status``).
ENUM_NAMES = {
    "JobStatusEnum": "jobstate.states.Status",
    "StepStatusEnum": "jobstate.models.step.SHOWN_STEP_STATUS",
}


class _OwnViews(APIView):
    """The schema and docs views (not documented themselves): drf-spectacular's,
    with jobstate's own throttle, content negotiation, error shape and no versioning."""

    throttle_classes = [JobstateThrottle]
    throttle_scope = "jobstate"
    content_negotiation_class = FormatNegotiation
    metadata_class = SimpleMetadata
    versioning_class = None
    schema = JobstateAutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler

    def perform_content_negotiation(self, request: Any, force: bool = False) -> tuple[BaseRenderer, str]:
        # ``force``: the error of a request no renderer fits (a 406) is rendered by
        # DRF's fallback, the view's first renderer: YAML for the schema, HTML for the
        # docs. JSON instead, the error shape every other endpoint answers in.
        try:
            return super().perform_content_negotiation(request)
        except APIException:
            if not force:
                raise
            return JSONRenderer(), JSONRenderer.media_type


class JobstateSchemaView(_OwnViews, SpectacularAPIView):
    """OpenAPI 3 schema of the jobstate API (YAML, or JSON by content negotiation).

    Its title, version and enum names are jobstate's whatever the project's
    SPECTACULAR_SETTINGS say (they describe the project's own API): the two
    ``status`` choice sets get names of their own instead of drf-spectacular's
    collision warning on every request."""

    generator_class = JobstateSchemaGenerator

    @property
    def custom_settings(self) -> dict[str, Any]:  # type: ignore[override]  # an attribute upstream
        return {
            "TITLE": "jobstate API",
            "DESCRIPTION": "Durable background jobs with a validated lifecycle.",
            "VERSION": jobstate.__version__,
            "ENUM_NAME_OVERRIDES": {**spectacular_settings.ENUM_NAME_OVERRIDES, **ENUM_NAMES},
        }

    @extend_schema(exclude=True)
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)


class JobstateDocsView(_OwnViews, SpectacularSwaggerView):
    """Swagger UI for the jobstate API, served from drf-spectacular-sidecar's
    static files when that app is installed (no CDN, whatever the project's
    SPECTACULAR_SETTINGS say), else as drf-spectacular is configured."""

    url_name = "jobstate-api:schema"

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        if apps.is_installed("drf_spectacular_sidecar"):
            return static(f"drf_spectacular_sidecar/swagger-ui-dist/{filename}")
        return cast(str, SpectacularSwaggerView._swagger_ui_resource(filename))

    @staticmethod
    def _swagger_ui_favicon() -> str:
        if apps.is_installed("drf_spectacular_sidecar"):
            return static("drf_spectacular_sidecar/swagger-ui-dist/favicon-32x32.png")
        return cast(str, SpectacularSwaggerView._swagger_ui_favicon())

    @extend_schema(exclude=True)
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)

    def options(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # Django's answer, the allowed methods: DRF's (the view's metadata) found no
        # template for the page's HTML renderer, a 500.
        return View.options(self, request, *args, **kwargs)
