"""Assets over the API: their representation; list, detail and download, scoped to their owner."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from jobstate import services
from jobstate.api.base import JobstateAPIView, parse_id
from jobstate.api.errors import ErrorSerializer
from jobstate.api.outputs import OutputSerializer
from jobstate.api.pagination import AssetPagination
from jobstate.api.permissions import visible_assets
from jobstate.api.renderers import PassthroughRenderer
from jobstate.api.schema import extend_schema
from jobstate.exceptions import UnservableFile
from jobstate.models import Asset


class AssetSerializer(OutputSerializer):
    url = serializers.SerializerMethodField(help_text="External location, for assets stored elsewhere.")
    download_url = serializers.SerializerMethodField(help_text="Streams the file (or redirects to `url`).")

    class Meta:
        model = Asset
        fields = [
            "id",
            "job",
            "asset_type",
            "name",
            "content_type",
            "size",
            "sha256",
            "metadata",
            "url",
            "download_url",
            "created_at",
        ]
        read_only_fields = fields

    def get_url(self, asset: Asset) -> str | None:
        # Only http(s): javascript: or data: would run in a client showing the link.
        return asset.web_url or None

    @extend_schema_field({"type": "string", "format": "uri"})
    def get_download_url(self, asset: Asset) -> str:
        try:
            path = reverse("jobstate-api:asset-download", kwargs={"pk": asset.pk})
        except NoReverseMatch:  # mounted without the namespace
            path = reverse("asset-download", kwargs={"pk": asset.pk})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


@extend_schema_view(
    list=extend_schema(
        summary="List assets",
        description="Your assets (staff with `jobstate.view_job`: everyone's), newest first.",
    ),
    retrieve=extend_schema(summary="Asset detail"),
)
class AssetViewSet(JobstateAPIView, viewsets.ReadOnlyModelViewSet[Asset]):
    """Files (or external URLs) produced by jobs."""

    queryset = Asset.objects.none()  # for schema introspection; see get_queryset
    serializer_class = AssetSerializer
    pagination_class = AssetPagination
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[Asset]:
        return visible_assets(self.request.user)

    def get_object(self) -> Asset:
        asset = self.get_queryset().filter(pk=parse_id(self.kwargs["pk"])).first()
        if asset is None:
            raise NotFound()
        return asset

    @extend_schema(
        summary="Download the asset's file",
        description="Streams the stored file as an attachment with its content type, length and a safe "
        "file name. An asset kept at an external http(s) URL answers 302 to that URL. One byte range "
        "(`Range: bytes=0-99`, `bytes=100-`, `bytes=-100`) answers 206 with those bytes; a range that "
        "starts past the end answers 416; an invalid `Range`, another unit or several ranges are "
        "ignored (the whole file). `HEAD` answers as `GET` would, without the body.",
        parameters=[
            OpenApiParameter(
                "Range",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="One byte range, to resume a download or seek: `bytes=first-last`, "
                "`bytes=first-` or `bytes=-suffix_length`.",
            ),
            OpenApiParameter(
                "If-Range",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="The `ETag` of the copy you hold: the range is sent if the file is still that "
                "one, else the whole file (200).",
            ),
            OpenApiParameter(
                "ETag",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="The file's SHA-256 in quotes (a strong validator, for `If-Range`).",
                response=[200, 206],
            ),
            OpenApiParameter(
                "Accept-Ranges",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="`bytes` (`none`: a storage's file that cannot tell its size, sent whole).",
                response=[200, 206],
            ),
            OpenApiParameter(
                "Content-Range",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="The bytes sent, `bytes first-last/size`; on a 416 `bytes */size`.",
                response=[206, 416],
            ),
        ],
        responses={
            (200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, "The file."),
            (206, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, "The requested range of the file."),
            302: OpenApiResponse(description="The asset lives at an external URL."),
            416: OpenApiResponse(ErrorSerializer, "The range starts past the end of the file."),
        },
    )
    @action(detail=True, renderer_classes=[JSONRenderer, PassthroughRenderer])
    def download(self, request: Request, pk: str | None = None) -> Any:
        asset = self.get_object()
        if not asset.file:
            if asset.web_url:
                return HttpResponseRedirect(asset.web_url)
            raise NotFound("This asset has no stored file.")
        try:
            return services.file_response(asset, request._request)
        except OSError:
            raise NotFound("The asset's file is missing from storage.") from None
        except UnservableFile as exc:  # logged by file_response
            raise NotFound(str(exc)) from None
