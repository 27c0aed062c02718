"""What every jobstate API view shares: authentication challenge, throttles,
parser, schema and the one error shape."""

from __future__ import annotations

import uuid
from typing import Any

from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import AuthenticationFailed, NotFound, ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobstate.api.errors import exception_handler
from jobstate.api.parsers import LimitedJSONParser
from jobstate.api.schema import JobstateAutoSchema
from jobstate.api.throttling import JobstateThrottle


class JobstateAPIView:
    # Settings every jobstate view carries itself, so the app behaves the same
    # whatever the project's REST_FRAMEWORK defaults are.

    permission_classes = [IsAuthenticated]
    throttle_classes = [JobstateThrottle]
    throttle_scope = "jobstate"
    parser_classes = [LimitedJSONParser]
    schema = JobstateAutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        reject_nul(request)
        super().initial(request, *args, **kwargs)  # type: ignore[misc]

    def get_authenticate_header(self, request: Request) -> str | None:
        # 401 (not 403) for anonymous requests whenever any configured scheme
        # can challenge (e.g. TokenAuthentication), whatever the class order.
        for authenticator in self.get_authenticators():  # type: ignore[attr-defined]
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None


NUL_MESSAGE = "Null characters are not allowed."


def reject_nul(request: Request) -> None:
    """PostgreSQL refuses NUL characters in text, so a NUL that reached a query
    would be a 500: refuse it up front, before authentication reads the token."""
    for name, values in request.query_params.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            raise ValidationError({name: [NUL_MESSAGE]})
    if "\x00" in request.META.get("HTTP_AUTHORIZATION", ""):
        raise AuthenticationFailed(f"Invalid Authorization header. {NUL_MESSAGE}")


def parse_id(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound() from None


class ApiRoot(JobstateAPIView, APIView):
    """Links to the endpoints, the schema and the docs (no data: open to all)."""

    permission_classes = [AllowAny]

    @extend_schema(
        summary="API root",
        responses={200: {"type": "object", "additionalProperties": {"type": "string", "format": "uri"}}},
    )
    def get(self, request: Request) -> Response:
        links = {}
        for name, url_name in LINKS.items():
            try:
                links[name] = request.build_absolute_uri(reverse(url_name))
            except NoReverseMatch:
                continue  # e.g. a project that serves no schema
        return Response(links)


LINKS = {
    "jobs": "jobstate-api:job-list",
    "stuck": "jobstate-api:job-stuck",
    "assets": "jobstate-api:asset-list",
    "schema": "api-schema",
    "docs": "api-docs",
}
