"""What every jobstate API view shares: authentication challenge, throttles,
parser, schema and the one error shape."""

from __future__ import annotations

import uuid
from typing import Any, NoReturn, cast

from django.apps import apps
from django.urls import NoReverseMatch, reverse
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed, NotFound, ValidationError
from rest_framework.metadata import SimpleMetadata
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from jobstate.api.errors import exception_handler
from jobstate.api.negotiation import FormatNegotiation
from jobstate.api.parsers import LimitedJSONParser
from jobstate.api.schema import JobstateAutoSchema, extend_schema
from jobstate.api.throttling import JobstateThrottle


class JobstateAPIView(APIView):
    # Every jobstate view's first base (listed before DRF's generic classes, it
    # leaves their MRO as it was). Settings every jobstate view carries itself, so
    # the app behaves the same whatever the project's REST_FRAMEWORK defaults are
    # (DRF binds most of them to APIView when it is imported): authentication,
    # permissions, throttles, parsers, renderers, content negotiation, versioning,
    # schema and errors.
    # Pagination and filter backends are set by each list view.

    permission_classes = [IsAuthenticated]
    throttle_classes = [JobstateThrottle]
    throttle_scope = "jobstate"
    parser_classes = [LimitedJSONParser]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    content_negotiation_class = FormatNegotiation
    metadata_class = SimpleMetadata
    versioning_class = None
    schema = JobstateAutoSchema()

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [auth() for auth in authentication_classes()]

    def get_exception_handler(self) -> Any:
        return exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        reject_nul(request)
        super().initial(request, *args, **kwargs)

    def permission_denied(
        self, request: Request, message: str | None = None, code: str | None = None
    ) -> NoReturn:
        if request.authenticators and not request.successful_authenticator:
            refusal = unknown_scheme(request, request.authenticators)
            if refusal:
                raise AuthenticationFailed(refusal)
        super().permission_denied(request, message, code)

    # DRF's own returns None as well when no scheme challenges (its stub says str).
    def get_authenticate_header(self, request: Request) -> str | None:  # type: ignore[override]
        # 401 (not 403) for anonymous requests whenever any configured scheme
        # can challenge (e.g. TokenAuthentication), whatever the class order.
        for authenticator in self.get_authenticators():
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None


def authentication_classes() -> list[type[BaseAuthentication]]:
    """Session and token authentication (token when ``rest_framework.authtoken``
    is installed), then whatever else the project authenticates with (JWT, …):
    a valid token works even where the project's defaults do not list it."""
    classes: list[type[BaseAuthentication]] = [SessionAuthentication]
    if apps.is_installed("rest_framework.authtoken"):
        classes.append(TokenAuthentication)
    # api_settings imports the dotted paths its stub types as strings.
    for cls in cast("list[type[BaseAuthentication]]", api_settings.DEFAULT_AUTHENTICATION_CLASSES):
        if cls not in classes:
            classes.append(cls)
    return classes


def unknown_scheme(request: Request, authenticators: Any) -> str | None:
    """For a request no authenticator took: what is wrong with its ``Authorization``
    header if it names a scheme none of them challenges with (``Bearer <token key>``
    was told "Authentication credentials were not provided."), else None.

    The message lists the schemes the authenticators challenge with and does not
    name the one sent: a class without ``authenticate_header`` may take it (with
    other credentials), and a key sent alone is not repeated back."""
    parts = request.META.get("HTTP_AUTHORIZATION", "").split()
    takes: dict[str, str] = {}  # scheme (lower case) -> how to send it
    for authenticator in authenticators:
        words = (authenticator.authenticate_header(request) or "").split()
        if words:
            credentials = "<key>" if isinstance(authenticator, TokenAuthentication) else "..."
            takes.setdefault(words[0].lower(), f"'Authorization: {words[0]} {credentials}'")
    if not parts or not takes or parts[0].lower() in takes:
        return None
    return f"This API takes {' or '.join(takes.values())}."


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


class ApiRoot(JobstateAPIView):
    """Links to the endpoints, the schema and the docs (no data: open to all)."""

    permission_classes = [AllowAny]

    @extend_schema(
        summary="API root",
        responses={200: {"type": "object", "additionalProperties": {"type": "string", "format": "uri"}}},
    )
    def get(self, request: Request) -> Response:
        links = {}
        for name, url_names in LINKS.items():
            for url_name in url_names:
                try:
                    links[name] = request.build_absolute_uri(reverse(url_name))
                    break
                except NoReverseMatch:
                    continue  # e.g. a project that serves no schema of its own
        return Response(links)


# Each link: the first URL name that resolves (a project's own schema views, if it
# mounts some under these names, then jobstate's).
LINKS = {
    "jobs": ("jobstate-api:job-list",),
    "kinds": ("jobstate-api:kind-list",),
    "stuck": ("jobstate-api:job-stuck",),
    "assets": ("jobstate-api:asset-list",),
    "webhooks": ("jobstate-api:webhook-list",),
    "schema": ("api-schema", "jobstate-api:schema"),
    "docs": ("api-docs", "jobstate-api:docs"),
}
