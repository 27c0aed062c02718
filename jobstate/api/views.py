"""The REST API for jobs: enqueue, list, detail, cancel, retry, operator
remedies, stuck jobs, history, assets and progress (SSE, long-poll).

Every query is scoped with ``visible_jobs(user)`` (staff holding
``jobstate.view_job`` see all, as in the admin), so another user's job is a
404, never a 403. Every change goes through
jobstate.services with ``Actor.api(user)``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_view
from rest_framework import ISO_8601, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from jobstate import registry, services
from jobstate.api.access import StreamAccess
from jobstate.api.assets import AssetSerializer
from jobstate.api.base import JobstateAPIView, parse_id
from jobstate.api.errors import ErrorSerializer, KindGone
from jobstate.api.fields import QueryChoicesField, StoredDateTimeField
from jobstate.api.filters import JobFilter
from jobstate.api.inputs import EnqueueSerializer, ReasonSerializer, RequiredReasonSerializer, RetrySerializer
from jobstate.api.longpoll import WAITED, WaitFirst, long_poll_view
from jobstate.api.outputs import JobDetailSerializer, JobEventSerializer, JobSerializer, StuckSerializer
from jobstate.api.pagination import EventPagination, JobAssetPagination, JobPagination, once
from jobstate.api.permissions import CanActOnJob, max_priority, may_start_kind, may_view_all, visible_jobs
from jobstate.api.renderers import EventStreamRenderer
from jobstate.api.schema import SSE_EVENT_SCHEMA, extend_schema
from jobstate.api.stream import finished_and_seen, streaming_response
from jobstate.api.throttling import count_stream, long_poll_seconds, open_stream
from jobstate.exceptions import InvalidParameters, UnknownKind
from jobstate.models import Asset, Job, JobEvent
from jobstate.models.job import with_retried
from jobstate.services import Actor
from jobstate.states import Status
from jobstate.stuck import REASONS, find_stuck
from jobstate.workflows.operators import retry_from

logger = logging.getLogger("jobstate.api")

# The columns the list shows (no parameters, result or traceback: large JSON
# and text the list never needs), the owner's name joined in.
LIST_COLUMNS = (
    *(f for f in JobSerializer.Meta.fields if f not in ("owner", "allowed_actions", "cancel_requested")),
    "cancel_requested_at",
)


def list_columns() -> tuple[str, ...]:
    # The owner's name under whatever field the user model names it.
    return (*LIST_COLUMNS, f"owner__{get_user_model().USERNAME_FIELD}")


def _retry_from(job: Job, step: str, actor: Actor, reason: str) -> Job:
    """``retry_from`` (as ``jobstate_workflow retry --from``); its refusals are the
    request's ``from_step`` errors: it checks them all before it writes anything."""
    try:
        return retry_from(job, step, actor=actor, reason=reason)
    except InvalidParameters:
        raise  # the job's parameters, not the step: answered as a plain retry's
    except DjangoValidationError as exc:
        raise ValidationError({"from_step": exc.messages}) from None


class StuckQuerySerializer(serializers.Serializer[Any]):
    reason = QueryChoicesField(
        choices=[r.code for r in REASONS], required=False, help_text="Only these reasons (repeat)."
    )


class WaitSerializer(serializers.Serializer[Any]):
    wait = serializers.FloatField(min_value=0, max_value=300, required=False)
    since = StoredDateTimeField(required=False, input_formats=[ISO_8601])


@extend_schema_view(
    list=extend_schema(
        summary="List jobs",
        description="Your jobs (staff with `jobstate.view_job`: everyone's), newest first.",
    ),
    create=extend_schema(
        summary="Enqueue a job",
        request=EnqueueSerializer,
        responses={
            201: OpenApiResponse(JobDetailSerializer, "Queued."),
            200: OpenApiResponse(
                JobDetailSerializer,
                "A replay: the job this key already names, enqueued with the same (cleaned) "
                "parameters and priority.",
            ),
            422: OpenApiResponse(
                ErrorSerializer,
                "`idempotency_key_reused`: the key names a job enqueued with other parameters or "
                "another priority (`error.fields` names which; `error.job_id` the job). Nothing is written.",
            ),
        },
        parameters=[
            OpenApiParameter(
                "Location",
                OpenApiTypes.URI,
                OpenApiParameter.HEADER,
                required=True,
                response=[200],
                description="The URL of the job the key names.",
            ),
            OpenApiParameter(
                "Idempotent-Replayed",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                required=True,
                enum=["true"],
                response=[200],
                description="A replay: no job was queued.",
            ),
        ],
    ),
    retrieve=extend_schema(
        summary="Job detail",
        parameters=[
            OpenApiParameter(
                "wait",
                OpenApiTypes.FLOAT,
                description="Long-poll: wait up to this many seconds (capped by the server) for the job "
                "to change (its `updated_at` to differ from `since`) before answering.",
            ),
            OpenApiParameter(
                "since",
                OpenApiTypes.DATETIME,
                description="With `wait`: the `updated_at` you already have (default: the current one).",
            ),
        ],
    ),
)
class JobViewSet(JobstateAPIView, viewsets.GenericViewSet[Any]):  # pages events and assets too
    """Jobs: enqueue, list, detail, cancel, retry, history, assets and progress."""

    queryset = Job.objects.none()  # for schema introspection; see get_queryset
    serializer_class = JobSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = JobFilter
    pagination_class = JobPagination

    @classmethod
    def as_view(cls, actions: dict[str, Any] | None = None, **initkwargs: Any) -> Any:
        view = super().as_view(actions, **initkwargs)
        if actions and actions.get("get") == "retrieve":
            return long_poll_view(view)  # async: a long-poll waits in the event loop
        return view

    def get_permissions(self) -> list[Any]:
        return [*super().get_permissions(), CanActOnJob()]

    def _waited(self) -> bool:
        return bool(getattr(self.request._request, WAITED, False))

    def get_throttles(self) -> list[Any]:
        if self._waited():
            return []  # the long-poll's own request, counted before it waited
        # A retry makes a new job too: it counts as an enqueue.
        self.throttle_scope = "jobstate_enqueue" if self.action in ("create", "retry") else "jobstate"
        # The stream scope is counted by ``stream`` and ``retrieve`` once they know whether
        # the request opens a stream (``count_stream``): a 400 is not counted at all.
        return super().get_throttles()

    def _wait_params(self) -> dict[str, Any]:
        """``wait`` and ``since``, each given at most once, not empty and valid, or a 400."""
        for param in ("wait", "since"):
            if once(self.request, param) == "":  # DRF reads "" as not given: no wait
                raise ValidationError({param: [f"'{param}' may not be empty."]})
        params = WaitSerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        return dict(params.validated_data)

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return JobSerializer if self.action == "list" else JobDetailSerializer

    def get_queryset(self) -> QuerySet[Job]:
        qs = with_retried(visible_jobs(self.request.user).select_related("owner"))
        if self.action == "list":
            return qs.only(*list_columns())
        return qs

    def get_object(self) -> Job:
        # No filter_queryset here: list filters must not hide a detail.
        pk = parse_id(self.kwargs["pk"])
        job = self.get_queryset().filter(pk=pk).first()
        if job is None:
            raise NotFound()
        self.check_object_permissions(self.request, job)
        return job

    def _visible_id(self, pk: Any) -> uuid.UUID:
        job_id = parse_id(pk)
        if not visible_jobs(self.request.user).filter(pk=job_id).exists():
            raise NotFound()
        return job_id

    def _stream_job(self, pk: Any) -> uuid.UUID:
        """``_visible_id`` for a stream or long-poll: its 404 opens nothing (``count_stream``)."""
        try:
            return self._visible_id(pk)
        except NotFound:
            count_stream(self.request, self, opens=False)
            raise

    def _detail(self, job_id: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
        job = self.get_queryset().prefetch_related("steps").get(pk=job_id)
        data = JobDetailSerializer(job, context=self.get_serializer_context()).data
        return Response(data, status=status_code, headers=headers)

    def _location(self, job_id: Any) -> str:
        return self.request.build_absolute_uri(reverse("jobstate-api:job-detail", kwargs={"pk": job_id}))

    # Endpoints ---------------------------------------------------------------

    def list(self, request: Request) -> Response:
        qs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(
            JobSerializer(page, many=True, context=self.get_serializer_context()).data
        )

    def retrieve(self, request: Request, pk: str | None = None) -> Response | WaitFirst:
        params = self._wait_params()
        wait = params.get("wait")
        waited = getattr(request._request, WAITED, None)
        if isinstance(waited, WaitFirst):
            lost = waited.access.lost()  # e.g. the token was deleted while it waited
            if lost is not None:
                raise lost
        if wait and not self._waited():
            job_id = self._stream_job(pk)
            since = params.get("since")
            if since is None:
                since = Job.objects.filter(pk=job_id).values_list("updated_at", flat=True).first()
            if since is not None:
                # long_poll_view waits (holding the slot, outside any transaction), then asks again.
                slot = open_stream(request, self, long_poll_seconds(wait))
                return WaitFirst(job_id, since, wait, slot, StreamAccess(request, job_id))
        job = self.get_queryset().prefetch_related("steps").filter(pk=parse_id(pk)).first()
        if job is None:
            raise NotFound()
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data)

    def create(self, request: Request) -> Response:
        user = request.user
        serializer = EnqueueSerializer(data=request.data, context={"max_priority": max_priority(user)})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if not may_start_kind(user, data["kind"]):
            # A kind the caller may not start answers as one not registered (GET /api/kinds/
            # leaves it out too): a 403 told any user which internal handler names exist.
            # The server's log still tells a developer who forgot ``api=`` why.
            if data["kind"] in registry.all_handlers():
                logger.info(
                    "API enqueue of kind %r refused: its api= policy does not let this caller start it",
                    data["kind"],
                )
            raise UnknownKind(data["kind"])
        # Keys are scoped per owner: the job a key names is always the caller's own. A key
        # naming other work is a 422 (KeyReused), as Stripe and the IETF draft answer it.
        job, created = services.get_or_enqueue(
            data["kind"],
            data["parameters"],
            owner=user,
            key=data["key"],
            watermark=data["watermark"],
            priority=data["priority"],
            run_after=data["run_after"],
            actor=Actor.api(user),
            match_request=True,
        )
        location = {"Location": self._location(job.pk)}
        if created:
            return self._detail(job.pk, status.HTTP_201_CREATED, location)
        return self._detail(job.pk, headers={**location, "Idempotent-Replayed": "true"})

    @extend_schema(
        summary="Cancel a job",
        request=ReasonSerializer,
        responses={
            200: OpenApiResponse(JobDetailSerializer, "A queued or waiting job: cancelled now."),
            202: OpenApiResponse(
                JobDetailSerializer,
                "A running job: cancel requested; its worker stops it. Or a queued or waiting "
                "workflow with undo_on_cancel that has undos to run: it stays (or goes) queued "
                "for one run of them, then ends cancelled.",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        updated = services.request_cancel(job, Actor.api(request.user), body.validated_data["reason"])
        code = status.HTTP_200_OK if updated.status == Status.CANCELLED else status.HTTP_202_ACCEPTED
        return self._detail(job.pk, code)

    @extend_schema(
        summary="Retry a finished job",
        description="Queues a new job linked to this one (`retry_of`); this one is not changed. A job is "
        "retried once: a second retry is a 409 `already_retried` naming the first (`retry_id`). A "
        "workflow runs again from its first step, or from `from_step`: a step that is not one of its "
        "steps, or one after a step that did not complete, is a 400 naming `from_step` (with the "
        "workflow's steps) and queues nothing.",
        request=RetrySerializer,
        responses={201: OpenApiResponse(JobDetailSerializer, "The new job.")},
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        body = RetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reason, step = body.validated_data["reason"], body.validated_data["from_step"]
        try:
            if step is None:
                new = services.retry(job, Actor.api(request.user), reason)
            else:
                new = _retry_from(job, step, Actor.api(request.user), reason)
        except UnknownKind as exc:
            raise KindGone(exc) from None
        return self._detail(new.pk, status.HTTP_201_CREATED, {"Location": self._location(new.pk)})

    @extend_schema(
        summary="Requeue a processing job (operators)",
        description="Puts a processing job (e.g. a stuck one) back in the queue; its worker's "
        "lease stops working. While that lease would still run its handler may too, so the job is "
        "not claimed before then (`run_after`: the old lease's expiry, when the worker's watchdog has "
        "stopped it); a job whose lease expired runs again at once. A waiting job is woken: it runs "
        "again now. Needs staff status and the `jobstate.requeue_job` permission.",
        request=ReasonSerializer,
        responses={200: JobDetailSerializer},
    )
    @action(detail=True, methods=["post"])
    def requeue(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.requeue(job, Actor.api(request.user), body.validated_data["reason"])
        return self._detail(job.pk)

    @extend_schema(
        summary="Fail a job with a reason (operators)",
        description="Ends a queued, waiting or processing job `failed`. Needs staff status and the "
        "`jobstate.requeue_job` permission.",
        request=RequiredReasonSerializer,
        responses={200: JobDetailSerializer},
    )
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        body = RequiredReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.force_fail(job, Actor.api(request.user), body.validated_data["reason"])
        return self._detail(job.pk)

    @extend_schema(
        summary="Jobs that need a person",
        description="Your stuck jobs (staff with `jobstate.view_job`: everyone's), grouped by reason "
        "(lease expired, past its timeout, no heartbeat, cancel not honoured, queued with no worker "
        "for its kind, failed and not retried), each with the remedy; at most `STUCK_LIST_LIMIT` per reason.",
        parameters=[StuckQuerySerializer],
        responses=StuckSerializer(many=True),
    )
    @action(detail=False, filter_backends=[], pagination_class=None)
    def stuck(self, request: Request) -> Response:
        params = StuckQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        codes = params.validated_data.get("reason") or None
        findings = find_stuck(codes=codes, queryset=visible_jobs(request.user))
        # ``since`` as a datetime, for the API's own format ("…Z"); as_dict's is isoformat's.
        rows = [{**f.as_dict(), "since": f.since} for f in findings]
        return Response(StuckSerializer(rows, many=True).data)

    @extend_schema(
        summary="Transition history",
        description="In the order it happened (event id). People other than you who acted on the job "
        "appear as `operator` unless you may view all jobs (staff with `jobstate.view_job`).",
        responses=JobEventSerializer(many=True),
    )
    @action(detail=True, filter_backends=[], pagination_class=EventPagination)
    def events(self, request: Request, pk: str | None = None) -> Response:
        job_id = self._visible_id(pk)
        page = self.paginate_queryset(JobEvent.objects.filter(job_id=job_id).select_related("actor"))
        context = {**self.get_serializer_context(), "names_users": may_view_all(request.user)}
        return self.get_paginated_response(JobEventSerializer(page, many=True, context=context).data)

    @extend_schema(summary="The job's assets", responses=AssetSerializer(many=True))
    @action(detail=True, filter_backends=[], pagination_class=JobAssetPagination)
    def assets(self, request: Request, pk: str | None = None) -> Response:
        job_id = self._visible_id(pk)
        page = self.paginate_queryset(Asset.objects.visible().filter(job_id=job_id))
        context = self.get_serializer_context()
        return self.get_paginated_response(AssetSerializer(page, many=True, context=context).data)

    @extend_schema(
        summary="Progress stream (Server-Sent Events)",
        description="`job` events carry a JSON snapshot (id, status, progress, progress_message, "
        "current_step, cancel_requested, error_message, updated_at, finished_at) each time the job "
        "changes; `end` closes the stream when the job is terminal (`reason: terminal`), deleted, or "
        "after the server's maximum duration (`reason: timeout`: reconnect to go on). A reconnect "
        "whose `Last-Event-ID` is a finished job's final event gets 204 (an EventSource stops reconnecting). "
        "Access is checked again every few seconds: once the credentials or the job's visibility are "
        "gone, an `error` event (the 401 or 404 error body) closes the stream; a poll the database is "
        "too busy for sends the 503 `database_busy` body as an `error` event, with `retry: 1000`; "
        "one whose database connection failed, the 503 `database_unavailable` body, with `retry: 5000`.",
        parameters=[
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.STR,
                location=OpenApiParameter.HEADER,
                description="On a reconnect, the `id` of the last event received (an EventSource "
                "sends it): the stream sends only what changed since, and a finished job's final "
                "event's id gets 204.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(SSE_EVENT_SCHEMA, "An event stream."),
            204: OpenApiResponse(description="The job has finished and the client has its final event."),
        },
    )
    @action(
        detail=True,
        url_path="events/stream",
        filter_backends=[],
        pagination_class=None,
        renderer_classes=[JSONRenderer, EventStreamRenderer],
    )
    def stream(self, request: Request, pk: str | None = None) -> HttpResponse | StreamingHttpResponse:
        job_id = self._stream_job(pk)
        last_id = request.headers.get("Last-Event-ID") or None
        seen = finished_and_seen(job_id, last_id)
        # A HEAD sends no event: it holds none of the user's streams.
        opens = not seen and request.method != "HEAD"
        if not opens:
            count_stream(request, self, opens=False)
        if seen:
            # 204 tells an EventSource to stop reconnecting (the SSE specification); no slot held.
            return HttpResponse(status=204, headers={"Cache-Control": "no-cache"})
        slot = open_stream(request, self) if opens else None
        # Async under ASGI (sent as made, no thread held), sync under WSGI.
        return streaming_response(request, job_id, last_id, slot, StreamAccess(request, job_id).refusal)
