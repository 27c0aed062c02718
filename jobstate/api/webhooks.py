"""``/api/webhooks/``: an owner's webhook endpoints (staff holding
``jobstate.view_job``: everyone's, and global ones), their secret rotation and
their deliveries.

Scoped like jobs (``permissions.may_view_all``): another user's endpoint is a
404. A global endpoint hears about every job, so making one is seeing every
job: only those who may view all jobs may. Staff without the permission are
ordinary owners here. Whoever makes an endpoint global or changes a global one
answers for it: it stops (is disabled) once they may not view every job
(``jobstate.webhooks.answerable``). Seeing is not changing: another user's
endpoint, or a global one, is changed, rotated or made global only by staff holding
``jobstate.change_webhookendpoint`` and deleted only with
``delete_webhookendpoint`` (a 403 otherwise). Its secret (which lets one forge
its messages) is shown once, in the answer that made it (creation, rotation).
This module sits
at the API layer (it builds on ``jobstate.api``); the rest of the package sits
below it.
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.db.models import QuerySet
from django.urls import reverse
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response

from jobstate import conf
from jobstate.api.base import JobstateAPIView
from jobstate.api.errors import Conflict
from jobstate.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictURLField,
)
from jobstate.api.inputs import StrictInput
from jobstate.api.outputs import OutputSerializer
from jobstate.api.pagination import KeysetPagination
from jobstate.api.permissions import may_view_all
from jobstate.api.schema import extend_schema
from jobstate.api.times import as_written
from jobstate.webhooks import answerable, ownership, rotation, validation, visibility
from jobstate.webhooks.models import EVENTS, WebhookDelivery, WebhookEndpoint


def may_manage(user: Any, endpoint: WebhookEndpoint, perm: str = "change") -> bool:
    """Whether ``user`` may change (``perm="delete"``: delete) ``endpoint``: its
    owner may; for anyone else's, or a global one, staff need the model
    permission (``jobstate.view_job`` only lets them read it)."""
    if endpoint.owner_id is not None and endpoint.owner_id == getattr(user, "pk", None):
        return True
    return bool(
        getattr(user, "is_staff", False)
        and getattr(user, "is_active", False)
        and user.has_perm(f"jobstate.{perm}_webhookendpoint")
    )


# The actions whose answer shows the secret they just made.
SHOWS_SECRET = frozenset({"create", "rotate_secret"})


# OutputSerializer: date-times in the API's format (ISO 8601 in UTC, "…Z"), not the
# project's REST_FRAMEWORK["DATETIME_FORMAT"] in its TIME_ZONE. StrictInput: a body
# field it does not take (``secret``, ``owner``, a typo) is a 400, not ignored.
class WebhookEndpointSerializer(StrictInput, OutputSerializer):
    """A webhook endpoint: a URL that gets a signed POST (Standard Webhooks) when a
    job it hears about changes. Its `secret` is shown once: on creation, on rotation
    and on a change of owner."""

    # Strict JSON types, as the jobs API's inputs: DRF's own fields took "yes" or 1
    # for true and 5 for "5".
    serializer_field_mapping = {
        **OutputSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.URLField: StrictURLField,
        models.BooleanField: StrictBooleanField,
    }

    owner = serializers.SerializerMethodField()
    answerable = serializers.SerializerMethodField(
        help_text="A global endpoint's: the staff user who made it global or last changed it. It is "
        "disabled once they may not view every job; null for an owner's endpoint (its owner answers "
        "for it)."
    )
    # No default: an update that leaves it out keeps it (a PUT turned a global
    # endpoint into its editor's own); a new endpoint is the caller's unless asked.
    is_global = StrictBooleanField(
        required=False,
        help_text="Staff with jobstate.view_job only: hear about every job, not only your own "
        "(default false).",
    )
    events = serializers.ListField(
        child=StrictChoiceField(choices=sorted(EVENTS)), allow_empty=False, required=False
    )
    kinds = serializers.ListField(
        # Not trimmed: a kind is matched as sent (validation.kinds refuses surrounding whitespace).
        child=StrictCharField(max_length=validation.KIND_MAX_LENGTH, trim_whitespace=False),
        required=False,
        help_text=f"Only jobs of these kinds (empty: every kind): at most {validation.MAX_KINDS}, "
        "repeats stored once, each exactly as sent (surrounding whitespace is a 400).",
    )
    secret = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The signing secret: in the answers to the endpoint's creation, to a rotation and "
        "to a change of is_global (which makes a new one) only (shown once: keep it); null "
        "everywhere else. Lost it? Rotate it.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "events",
            "kinds",
            "enabled",
            "is_global",
            "owner",
            "answerable",
            *WebhookEndpoint.SERVER_FIELDS,
        ]
        read_only_fields = ["owner", "answerable", *WebhookEndpoint.SERVER_FIELDS]

    def get_owner(self, endpoint: WebhookEndpoint) -> str | None:
        return endpoint.owner.get_username() if endpoint.owner_id is not None and endpoint.owner else None

    def get_answerable(self, endpoint: WebhookEndpoint) -> str | None:
        user = endpoint.answerable if endpoint.answerable_id is not None else None
        return user.get_username() if user else None

    def to_representation(self, instance: WebhookEndpoint) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["is_global"] = instance.owner_id is None
        # A secret is shown once, in the answer to the request that made it: the
        # endpoint's creation (to its maker), a rotation (to whoever may rotate it) or a
        # change of owner, which makes one (``ownership``).
        # Never again: a list would hand over every secret its reader may change, and a
        # GET or PUT showed one to anyone holding its owner's token at any later time.
        view = self.context.get("view")
        if getattr(view, "action", None) not in SHOWS_SECRET and not getattr(view, "made_secret", False):
            data["secret"] = None
        return data

    # The rules are jobstate.webhooks.validation's, shared with the admin's form.
    def validate_url(self, value: str) -> str:
        return validation.url(value)

    def validate_events(self, value: list[str]) -> list[str]:
        return validation.events(value)

    def validate_kinds(self, value: list[str]) -> list[str]:
        return validation.kinds(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        user = self.context["request"].user
        if attrs.get("is_global") and not may_view_all(user):
            raise PermissionDenied(
                "Only staff who may view all jobs (jobstate.view_job) make global endpoints."
            )
        return attrs


class DeliverySerializer(OutputSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook_id",
            "event",
            "job_id",
            "delivery_job_id",
            "attempt",
            "ok",
            "status_code",
            "error",
            "response_body",
            "duration_ms",
            "created_at",
        ]
        read_only_fields = fields


class RotateSerializer(StrictInput):
    """A new signing secret for the endpoint; the previous one keeps signing for
    `overlap_seconds`."""

    overlap_seconds = StrictIntegerField(
        min_value=0,
        max_value=30 * 24 * 3600,
        required=False,
        help_text="How long the previous secret keeps signing (default WEBHOOK_SECRET_OVERLAP_SECONDS).",
    )


class NewestFirst(KeysetPagination):
    orderings = {"-id": ("-id",)}
    default_ordering = "-id"


# Actions that read the endpoint locked, in the transaction that writes it: two
# rotations at once both passed the overlap check, and the second's save dropped
# the secret the first had just returned; an update's or a rotation's full-row
# save from a stale read undid a delivery's failure count or auto-disable.
LOCKED_ACTIONS = frozenset({"update", "partial_update", "rotate_secret"})


class WebhookEndpointViewSet(JobstateAPIView, viewsets.ModelViewSet[Any]):  # pages deliveries too
    """Webhook endpoints: where job events are posted, signed (Standard Webhooks)."""

    serializer_class = WebhookEndpointSerializer
    queryset = WebhookEndpoint.objects.none()  # schema introspection; see get_queryset
    made_secret = False  # this request gave the endpoint a new secret (a change of owner)
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        user = self.request.user
        qs = WebhookEndpoint.objects.select_related("owner", "answerable")
        if self.action in LOCKED_ACTIONS:
            # Read under the row lock that the write keeps (see ``update``).
            qs = qs.select_for_update(of=("self",))
        if may_view_all(user):
            return qs
        if not getattr(user, "is_authenticated", False):
            return qs.none()
        return qs.filter(owner=user)  # type: ignore[misc]  # authenticated: a user (getattr does not narrow)

    def get_object(self) -> WebhookEndpoint:
        endpoint: WebhookEndpoint = super().get_object()
        if self.request.method not in SAFE_METHODS:
            perm = "delete" if self.request.method == "DELETE" else "change"
            if not may_manage(self.request.user, endpoint, perm):
                raise PermissionDenied(
                    f"Only its owner, or staff with jobstate.{perm}_webhookendpoint, may {perm} "
                    "this endpoint."
                )
        return endpoint

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # The row is locked from its read to its write: a full-row save from a stale
        # read undid what a delivery wrote meanwhile (failure count, auto-disable).
        with transaction.atomic():
            return super().update(request, *args, **kwargs)

    def get_success_headers(self, data: Any) -> dict[str, str]:
        # The new endpoint's own URL. DRF's default took the body's ``url`` field,
        # which here is the address deliveries go to, not this API's resource.
        path = reverse("jobstate-api:webhook-detail", kwargs={"pk": data["id"]})
        return {"Location": self.request.build_absolute_uri(path)}

    def perform_create(self, serializer: serializers.BaseSerializer[WebhookEndpoint]) -> None:
        is_global = serializer.validated_data.pop("is_global", False)
        owner = None if is_global else self.request.user
        serializer.save(owner=owner, answerable=answerable.for_editor(owner, self.request.user))

    def perform_update(self, serializer: serializers.BaseSerializer[WebhookEndpoint]) -> None:
        data = serializer.validated_data
        endpoint: WebhookEndpoint = serializer.instance  # type: ignore[assignment]
        if "is_global" in data:
            is_global = data.pop("is_global")
            if is_global != (endpoint.owner_id is None):
                if not may_view_all(self.request.user):
                    raise PermissionDenied(
                        "Only staff who may view all jobs (jobstate.view_job) change whether an "
                        "endpoint is global."
                    )
                data["owner"] = None if is_global else self.request.user
        extra: dict[str, Any] = {}
        if "owner" in data:
            # Nothing of the previous owner's: failure count, reason, secret (``ownership``).
            extra = ownership.handed_over(endpoint)
            self.made_secret = True
        if data.get("enabled") and not endpoint.enabled:
            # Re-enabled by its owner: start counting failures afresh.
            extra |= {"consecutive_failures": 0, "disabled_at": None, "disabled_reason": ""}
        # A global endpoint is answered for by whoever last changed it (``answerable``).
        owner = data.get("owner", endpoint.owner)
        extra["answerable"] = answerable.for_editor(owner, self.request.user)
        serializer.save(**extra)

    @extend_schema(summary="Rotate the signing secret", request=RotateSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        with transaction.atomic():  # one rotation at a time (see LOCKED_ACTIONS)
            return self._rotate(request)

    def _rotate(self, request: Request) -> Response:
        endpoint = self.get_object()
        body = RotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        overlap = body.validated_data.get("overlap_seconds", conf.get("WEBHOOK_SECRET_OVERLAP_SECONDS"))
        try:
            endpoint = rotation.rotate(endpoint.pk, overlap)
        except rotation.RotationRefused as exc:
            raise Conflict(exc.message(as_written(exc.signing_until))) from None
        return Response(self.get_serializer(endpoint).data, status=status.HTTP_200_OK)

    @extend_schema(summary="Delivery attempts, newest first", responses=DeliverySerializer(many=True))
    @action(detail=True)
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        endpoint = self.get_object()
        # Those about the caller's jobs (all for staff who see every job): the endpoint
        # may have been someone else's (``visibility``).
        records = visibility.seen_by(WebhookDelivery.objects.filter(endpoint=endpoint), request.user)
        page = self.paginate_queryset(records)
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)
