"""One JSON error shape for every API response that is not a success.

    {"error": {"code": "invalid_transition", "message": "...", "fields": {...}}}

``fields`` maps an input field to its messages (empty when the error is not
about a field); a refused transition also carries ``current_status``, a second retry ``retry_id``,
a reused idempotency key ``job_id``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import (
    ObjectDoesNotExist,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response

from jobstate.exceptions import (
    AlreadyRetried,
    InvalidParameters,
    InvalidTransition,
    KeyReused,
    LeaseLost,
    ParentEnded,
    PauseRefused,
    RangeNotSatisfiable,
    UnknownKind,
    contended,
    disconnected,
)
from jobstate.services import DuplicateActiveKey
from jobstate.states import Status

logger = logging.getLogger("jobstate.api")

# Seconds a client waits before trying again a request the database was too busy for
# (a lock held by another write: SQLite's busy timeout, PostgreSQL's lock_timeout).
BUSY_RETRY_AFTER = 1
BUSY_MESSAGE = "The database is busy with other writes; try again after Retry-After seconds."
# Seconds a client waits before trying again a request whose database connection failed
# (PostgreSQL down or restarting): long enough for a restart or a failover to finish.
UNAVAILABLE_RETRY_AFTER = 5
UNAVAILABLE_MESSAGE = "The database is unavailable; try again after Retry-After seconds."


def is_busy(exc: BaseException) -> bool:
    """A database error from other transactions holding what it needed (``contended``):
    the same request may succeed in a moment, so a 503 ``database_busy`` with
    ``Retry-After``, not a 500."""
    return isinstance(exc, OperationalError) and contended(exc)


def is_unavailable(exc: BaseException) -> bool:
    """A database error from the connection, not the request (``disconnected``: refused,
    not made, ended by the server): the same request may succeed once the database is
    back, so a 503 ``database_unavailable`` with ``Retry-After``, not a 500."""
    return isinstance(exc, OperationalError | InterfaceError) and disconnected(exc)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (libpq's take several) for a one-line warning."""
    return " ".join(str(exc).split())


# The shape, for the schema ------------------------------------------------


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
    retry_id = serializers.UUIDField(
        required=False, help_text="The job's retry, for `already_retried`: retry that one instead."
    )
    job_id = serializers.UUIDField(
        required=False,
        help_text="The job the key names, for `idempotency_key_reused`: enqueued with other work.",
    )


class ErrorSerializer(serializers.Serializer[Any]):
    error = ErrorDetailSerializer()


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The request conflicts with the job's current state."


class KindGone(exceptions.APIException):
    """A retry of a job whose kind has no handler here any more: the request has no
    ``kind`` field to blame (``UnknownKind``'s field error is an enqueue's)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "unknown_kind"

    def __init__(self, exc: UnknownKind) -> None:
        super().__init__(exc.retry_refusal)
        self.kind = exc.kind


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "The request body is too large."


def error_body(code: str, message: str, fields: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}, **extra}}


def _flatten(detail: Any) -> Any:
    """DRF ErrorDetail trees to plain strings, lists and dicts."""
    if isinstance(detail, dict):
        return {str(k): _flatten(v) for k, v in detail.items()}
    if isinstance(detail, list | tuple):
        return [_flatten(v) for v in detail]
    return str(detail)


def _django_validation_fields(exc: DjangoValidationError) -> dict[str, Any]:
    if isinstance(exc, InvalidParameters):
        return {"parameters": exc.errors}
    if hasattr(exc, "error_dict"):
        return {k: [str(m) for m in msgs] for k, msgs in exc.message_dict.items()}
    return {"non_field_errors": [str(m) for m in exc.messages]}


def _first_message(fields: dict[str, Any], default: str) -> str:
    """The first field error as "path.to.field: message" (for ``message``)."""
    for name, value in fields.items():
        path = [name]
        while isinstance(value, dict) and value:
            key, value = next(iter(value.items()))
            path.append(str(key))
        if isinstance(value, list) and value and isinstance(value[0], str):
            return value[0] if path == ["non_field_errors"] else f"{'.'.join(path)}: {value[0]}"
    return default


def _api_exception(exc: exceptions.APIException) -> tuple[str, str, dict[str, Any]]:
    if isinstance(exc, exceptions.ValidationError):
        detail = _flatten(exc.detail)
        fields = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        return "invalid", _first_message(fields, "Invalid input."), fields
    detail = exc.detail
    if isinstance(detail, dict | list):
        return exc.default_code, str(exc.default_detail), {"detail": _flatten(detail)}
    code = getattr(detail, "code", None) or exc.default_code
    return str(code), str(detail), {}


def api_error_body(exc: exceptions.APIException) -> dict[str, Any]:
    """The body ``exception_handler`` answers ``exc`` with (an auth or lookup error)."""
    code, message, fields = _api_exception(exc)
    return error_body(code, message, fields)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF ``EXCEPTION_HANDLER``: map every error to the shape above."""
    headers: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if isinstance(exc, InvalidTransition):
        code, status_code = "invalid_transition", 409
        message = _transition_message(exc)
        fields: dict[str, Any] = {}
        extra["current_status"] = exc.current
    elif isinstance(exc, LeaseLost):
        code, status_code, message, fields = "lease_lost", 409, str(exc), {}
    elif isinstance(exc, DuplicateActiveKey):
        code, status_code, message, fields = "duplicate_active_key", 409, str(exc), {}
    elif isinstance(exc, KeyReused):
        code, status_code, message = "idempotency_key_reused", 422, str(exc)
        differs = f"Differs from job {exc.job_id}'s, which key '{exc.key}' names."
        fields = {name: [differs] for name in exc.fields}
        extra["job_id"] = str(exc.job_id)
    elif isinstance(exc, ParentEnded):
        code, status_code, message, fields = "parent_ended", 409, str(exc), {}
    elif isinstance(exc, AlreadyRetried):
        code, status_code, message, fields = "already_retried", 409, str(exc), {}
        extra["retry_id"] = str(exc.retry_id)
    elif isinstance(exc, PauseRefused):
        # The services' refusal as they word it (the admin and the CLI say the same).
        code, status_code, fields = "pause_refused", 409, {}
        message = f"{exc.refusal[:1].upper()}{exc.refusal[1:]}."
    elif isinstance(exc, UnknownKind):
        code, status_code = "unknown_kind", 400
        fields = {"kind": [f"Unknown job kind '{exc.kind}'."]}
        message = fields["kind"][0]
    elif isinstance(exc, InvalidParameters):
        code, status_code = "invalid_parameters", 400
        fields = {"parameters": exc.errors}
        message = _first_message(fields, "Parameters are invalid.")
    elif isinstance(exc, DjangoValidationError):
        code, status_code = "invalid", 400
        fields = _django_validation_fields(exc)
        message = _first_message(fields, "Invalid input.")
    elif isinstance(exc, RangeNotSatisfiable):
        code, status_code, message, fields = "range_not_satisfiable", 416, str(exc), {}
        headers["Content-Range"] = exc.content_range
    elif isinstance(exc, Http404 | ObjectDoesNotExist):
        code, status_code, message, fields = "not_found", 404, "Not found.", {}
    elif isinstance(exc, DjangoPermissionDenied):
        code, status_code, message, fields = "permission_denied", 403, "Permission denied.", {}
    elif isinstance(exc, RequestDataTooBig):
        code, status_code, message, fields = "payload_too_large", 413, "The request body is too large.", {}
    elif isinstance(exc, SuspiciousOperation):
        # Django answers these 400 (e.g. more query parameters than DATA_UPLOAD_MAX_NUMBER_FIELDS,
        # raised when the view first reads them); caught here, they were 500s.
        logging.getLogger(f"django.security.{type(exc).__name__}").error(str(exc))
        code, status_code, fields = "invalid", 400, {}
        message = _suspicious_message(exc)
    elif isinstance(exc, exceptions.APIException):
        code, message, fields = _api_exception(exc)
        status_code = exc.status_code
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            auth_header = _authenticate_header(context)
            if auth_header:
                headers["WWW-Authenticate"] = auth_header
            else:
                status_code = 403
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        if getattr(exc, "wait", None) is not None:
            headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    elif is_busy(exc):
        # Its transaction was rolled back: the same request may succeed in a moment.
        logger.warning("Database busy in API view %s: %s", context.get("view"), exc)
        code, status_code, fields, message = "database_busy", 503, {}, BUSY_MESSAGE
        headers["Retry-After"] = str(BUSY_RETRY_AFTER)
    elif is_unavailable(exc):
        # Not a bug: one line, no traceback (an outage would log one per request).
        logger.warning("Database unavailable in API view %s: %s", context.get("view"), one_line(exc))
        code, status_code, fields, message = "database_unavailable", 503, {}, UNAVAILABLE_MESSAGE
        headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    else:
        # A bug, not bad input: log it with its traceback, answer in the same shape.
        logger.exception("Unhandled error in API view %s", context.get("view"))
        code, status_code, message, fields = "server_error", 500, "Internal server error.", {}
    _roll_back(context)
    return Response(error_body(code, message, fields, **extra), status=status_code, headers=headers)


def _suspicious_message(exc: SuspiciousOperation) -> str:
    if isinstance(exc, TooManyFieldsSent):
        return f"Too many parameters: at most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}."
    return "Bad request."


def _authenticate_header(context: dict[str, Any]) -> str | None:
    view, request = context.get("view"), context.get("request")
    if view is None or request is None:
        return None
    header: str | None = view.get_authenticate_header(request)
    return header


def _roll_back(context: dict[str, Any]) -> None:
    # Same as DRF's handler: an ATOMIC_REQUESTS transaction must not commit.
    from rest_framework.views import set_rollback

    set_rollback()


def _transition_message(exc: InvalidTransition) -> str:
    refusal = exc.refusal  # "the job is queued; only a finished job can be retried"
    return f"{refusal[:1].upper()}{refusal[1:]}."


@csrf_exempt  # a JSON 404 for any method; it changes nothing
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """A JSON 404 for any path under the API that matches no endpoint."""
    path = request.path
    message = "No API endpoint at this path."
    if not path.endswith("/"):
        try:
            resolved = resolve(path + "/")
        except Resolver404:
            resolved = None
        if resolved is not None and resolved.func is not not_found:
            message = f"No API endpoint at this path; did you mean '{path}/'?"
    return JsonResponse(error_body("not_found", message), status=404)
