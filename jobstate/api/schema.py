"""OpenAPI (drf-spectacular): every operation documents the error responses it
can give, all in the one error shape, so schema-driven clients and tests know
them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema

from jobstate.api.serializers import ErrorSerializer

# One Server-Sent Event, as OpenAPI describes an event stream's items. ``data``
# is JSON: a job snapshot for ``job``, {"reason", "status"?} for ``end``, the
# error shape for ``error``.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["job", "end", "error"]},
        "data": {"type": "string", "description": "JSON"},
        "id": {"type": "string", "description": "The job's updated_at (send back as Last-Event-ID)."},
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
    "409": "Refused in the job's current state (see `error.current_status`).",
    "413": "Request body too large.",
    "415": "Unsupported media type (send JSON).",
    "429": "Throttled; retry after `Retry-After` seconds.",
}


class JobstateAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        codes = ["400", "401", "403", "405", "406", "429"]
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
