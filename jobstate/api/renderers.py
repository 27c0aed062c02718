"""Renderers for the two non-JSON endpoints: the SSE stream and file downloads."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from rest_framework.renderers import BaseRenderer, JSONRenderer


class EventStreamRenderer(BaseRenderer):
    """Lets a client that sends ``Accept: text/event-stream`` through content
    negotiation. The stream itself is a StreamingHttpResponse; only errors
    before it starts are rendered here, as one ``error`` event. Anything else (an
    ``OPTIONS``' metadata) is JSON, as every other endpoint sends it."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if data is None:
            return b""
        response = (renderer_context or {}).get("response")
        if response is not None and response.status_code < 400:
            response["Content-Type"] = "application/json"
            return JSONRenderer().render(data, "application/json", renderer_context)
        return f"event: error\ndata: {json.dumps(data, cls=DjangoJSONEncoder)}\n\n".encode()


class PassthroughRenderer(BaseRenderer):
    """Accepts any ``Accept`` header for file downloads (the body is a file
    response, not rendered); errors are written as JSON."""

    media_type = "*/*"
    format = "file"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if data is None:
            return b""
        response = (renderer_context or {}).get("response")
        if response is not None:
            response["Content-Type"] = "application/json"
        return json.dumps(data, cls=DjangoJSONEncoder).encode()
