"""``/api/webhooks/``: an owner's webhook endpoints (staff holding
``jobstate.view_job``: everyone's, and global ones), their secret rotation and
their deliveries.

Scoped like jobs (``permissions.may_view_all``): another user's endpoint is a
404. A global endpoint hears about every job, so making one is seeing every
job: only those who may view all jobs may. Staff without the permission are
ordinary owners here. This module sits at the API layer (it builds on
``jobstate.api``); the rest of the package sits below it.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from jobstate import conf
from jobstate.api.base import JobstateAPIView
from jobstate.api.pagination import KeysetPagination
from jobstate.api.permissions import may_view_all
from jobstate.api.schema import extend_schema
from jobstate.webhooks import transport
from jobstate.webhooks.models import EVENTS, WebhookDelivery, WebhookEndpoint, new_secret


class WebhookEndpointSerializer(serializers.ModelSerializer[WebhookEndpoint]):
    owner = serializers.SerializerMethodField()
    is_global = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Staff with jobstate.view_job only: hear about every job, not only your own.",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(EVENTS)), allow_empty=False, required=False
    )
    kinds = serializers.ListField(child=serializers.CharField(max_length=200), required=False)

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
            *WebhookEndpoint.SERVER_FIELDS,
        ]
        read_only_fields = ["owner", *WebhookEndpoint.SERVER_FIELDS]

    def get_owner(self, endpoint: WebhookEndpoint) -> str | None:
        return endpoint.owner.get_username() if endpoint.owner_id is not None and endpoint.owner else None

    def to_representation(self, instance: WebhookEndpoint) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["is_global"] = instance.owner_id is None
        return data

    def validate_url(self, value: str) -> str:
        try:
            transport.check_url(value)
        except transport.Blocked as exc:
            raise serializers.ValidationError(str(exc)) from None
        host = urlsplit(value).hostname or ""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            return value  # a name: checked after resolution, at each delivery
        if not conf.get("WEBHOOK_ALLOW_PRIVATE") and transport.forbidden(str(literal)):
            raise serializers.ValidationError("Deliveries to non-public addresses are not allowed here.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        user = self.context["request"].user
        if attrs.get("is_global") and not may_view_all(user):
            raise PermissionDenied(
                "Only staff who may view all jobs (jobstate.view_job) make global endpoints."
            )
        return attrs


class DeliverySerializer(serializers.ModelSerializer[WebhookDelivery]):
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


class RotateSerializer(serializers.Serializer[Any]):
    overlap_seconds = serializers.IntegerField(
        min_value=0,
        max_value=30 * 24 * 3600,
        required=False,
        help_text="How long the previous secret keeps signing (default WEBHOOK_SECRET_OVERLAP_SECONDS).",
    )


class NewestFirst(KeysetPagination):
    orderings = {"-id": ("-id",)}
    default_ordering = "-id"


class WebhookEndpointViewSet(JobstateAPIView, viewsets.ModelViewSet[Any]):  # pages deliveries too
    """Webhook endpoints: where job events are posted, signed (Standard Webhooks)."""

    serializer_class = WebhookEndpointSerializer
    queryset = WebhookEndpoint.objects.none()  # schema introspection; see get_queryset
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        user = self.request.user
        qs = WebhookEndpoint.objects.select_related("owner")
        if may_view_all(user):
            return qs
        if not getattr(user, "is_authenticated", False):
            return qs.none()
        return qs.filter(owner=user)  # type: ignore[misc]  # authenticated: a user (getattr does not narrow)

    def perform_create(self, serializer: serializers.BaseSerializer[WebhookEndpoint]) -> None:
        is_global = serializer.validated_data.pop("is_global", False)
        serializer.save(owner=None if is_global else self.request.user)

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
        if data.get("enabled") and not endpoint.enabled:
            # Re-enabled by its owner: start counting failures afresh.
            extra = {"consecutive_failures": 0, "disabled_at": None, "disabled_reason": ""}
        serializer.save(**extra)

    @extend_schema(summary="Rotate the signing secret", request=RotateSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        endpoint = self.get_object()
        body = RotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        overlap = body.validated_data.get("overlap_seconds", conf.get("WEBHOOK_SECRET_OVERLAP_SECONDS"))
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_expires_at = timezone.now() + timedelta(seconds=overlap)
        endpoint.secret = new_secret()
        endpoint.save()
        return Response(self.get_serializer(endpoint).data, status=status.HTTP_200_OK)

    @extend_schema(summary="Delivery attempts, newest first", responses=DeliverySerializer(many=True))
    @action(detail=True)
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        endpoint = self.get_object()
        page = self.paginate_queryset(WebhookDelivery.objects.filter(endpoint=endpoint))
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)
