"""Paused kinds in the API: ``POST /kinds/{name}/pause/`` and ``.../resume/`` (staff
holding ``jobstate.change_job``, as in the admin), and what ``GET /kinds/`` shows of
a kind's pause (``pause_fields``).

Both actions go through ``jobstate.services.pauses``, whose refusals write nothing:
a kind already paused, or not paused, is a 409 ``pause_refused``; a name that is no
kind (not registered, no job stored, not paused) a 404. A pause says nothing about
anyone's jobs: no counts, no ids.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from jobstate import services
from jobstate.api.base import JobstateAPIView
from jobstate.api.fields import StrictCharField
from jobstate.api.inputs import StrictInput
from jobstate.api.outputs import OutputSerializer
from jobstate.api.permissions import CanPauseKinds
from jobstate.api.schema import extend_schema
from jobstate.api.times import as_written
from jobstate.exceptions import UnknownKind
from jobstate.models import KindPause
from jobstate.services import Actor
from jobstate.services.pauses import active_pause, may_be_paused
from jobstate.storable import text

REASON_MAX = 1000  # as the admin's form


class PauseKindSerializer(StrictInput):
    """Why the kind is paused (required): kept in the pause's record with your user name."""

    reason = StrictCharField(
        max_length=REASON_MAX, min_length=1, help_text="Why: kept in the pause's record."
    )


class ResumeKindSerializer(StrictInput):
    """An optional reason for the resume, kept in the pause's record."""

    reason = StrictCharField(max_length=REASON_MAX, required=False, allow_blank=True, default="")


class KindPauseSerializer(OutputSerializer):
    """One pause of a kind: who paused it, when and why, and, once resumed, who
    resumed it, when and why."""

    paused = serializers.BooleanField(
        source="active", read_only=True, help_text="Still paused (not resumed yet)."
    )
    paused_by = serializers.CharField(
        source="paused_by_text", read_only=True, help_text="Who paused it: `api (alice)`."
    )
    resumed_by = serializers.SerializerMethodField(help_text="Who resumed it (null while it is paused).")

    class Meta:
        model = KindPause
        fields = [
            "kind",
            "paused",
            "paused_at",
            "paused_by",
            "reason",
            "resumed_at",
            "resumed_by",
            "resume_reason",
        ]
        read_only_fields = fields

    def get_resumed_by(self, pause: KindPause) -> str | None:
        return None if pause.active else pause.resumed_by_text


def pause_fields(pause: KindPause | None, names_people: bool) -> dict[str, Any]:
    """What ``GET /kinds/`` shows of a kind's active pause (None: not paused): whether
    and since when to everyone; why and by whom only to ``names_people`` (those who may
    view all jobs): a reason may be internal."""
    shown: dict[str, Any] = {
        "paused": pause is not None,
        "paused_since": None if pause is None else as_written(pause.paused_at),
    }
    if names_people:
        shown["pause_reason"] = None if pause is None else pause.reason
        shown["paused_by"] = None if pause is None else pause.paused_by_text
    return shown


def _kind(name: str) -> str:
    """``name`` as the services take it, if it names a kind: registered, with jobs
    stored, or paused (a kind whose handler and jobs went since); else a 404."""
    kind = text(name)
    if not (may_be_paused(kind) or active_pause(kind) is not None):
        raise NotFound()
    return kind


class KindPauseAction(JobstateAPIView):
    permission_classes = [*JobstateAPIView.permission_classes, CanPauseKinds]


class PauseKind(KindPauseAction):
    """Pause a kind: no worker claims its queued jobs until it is resumed."""

    @extend_schema(
        summary="Pause a kind (operators)",
        description="From the commit on, no worker claims (or starts) the kind's queued jobs, anyone's, "
        "until it is resumed; they stay queued, enqueue still accepts new ones and running jobs finish "
        "(`services.pause_kind`). A kind already paused is a 409 `pause_refused` saying by whom, since "
        "when and why; a name that is no kind (not registered, no job stored) a 404. Needs staff status "
        "and the `jobstate.change_job` permission, as the admin's Pause.",
        request=PauseKindSerializer,
        responses={200: OpenApiResponse(KindPauseSerializer, "Paused: the new pause.")},
    )
    def post(self, request: Request, name: str) -> Response:
        kind = _kind(name)
        body = PauseKindSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            pause = services.pause_kind(kind, Actor.api(request.user), body.validated_data["reason"])
        except UnknownKind:  # its jobs went since the check
            raise NotFound() from None
        return Response(KindPauseSerializer(pause).data)


class ResumeKind(KindPauseAction):
    """Resume a paused kind: its queued jobs are claimed again."""

    @extend_schema(
        summary="Resume a paused kind (operators)",
        description="From the commit on, the kind's queued jobs are claimed again "
        "(`services.resume_kind`); the pause is kept as its record. A kind that is not paused is a 409 "
        "`pause_refused`; a name that is no kind a 404. Needs staff status and the `jobstate.change_job` "
        "permission, as the admin's Resume.",
        request=ResumeKindSerializer,
        responses={200: OpenApiResponse(KindPauseSerializer, "Resumed: the pause, now ended.")},
    )
    def post(self, request: Request, name: str) -> Response:
        kind = _kind(name)
        body = ResumeKindSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        pause = services.resume_kind(kind, Actor.api(request.user), body.validated_data["reason"])
        return Response(KindPauseSerializer(pause).data)
