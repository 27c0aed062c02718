"""An endpoint's signing secret in the admin: shown once, when it is made (the
endpoint's creation, a rotation, a change of owner: ``jobstate.webhooks.ownership``),
and never again.

Making a secret grants this session one look at it: the add form, the rotation and
a save that changed the owner redirect to the endpoint's secret page, which shows it while the grant holds and
spends the grant (a reload says it was shown). The session keeps the endpoint's
id and a digest of the secret, never the secret: a message would carry the
secret in a cookie. The endpoint's page says only that a secret is set, with a
*Rotate secret* button for those who may change the endpoint; whoever lost a
secret rotates it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from jobstate import conf
from jobstate.admin.views import page_context
from jobstate.webhooks import rotation
from jobstate.webhooks.models import WebhookEndpoint

SESSION_KEY = "jobstate.webhook_secret_grants"
SECRET_PAGE = "admin/jobstate/webhookendpoint/secret.html"
ROTATE_PAGE = "admin/jobstate/webhookendpoint/rotate_secret.html"
MAX_OVERLAP_SECONDS = 30 * 24 * 3600  # the API's


class RotateForm(forms.Form):
    overlap_seconds = forms.IntegerField(
        min_value=0,
        max_value=MAX_OVERLAP_SECONDS,
        label="Overlap (seconds)",
        help_text="How long the old secret keeps signing beside the new one, so that receivers can "
        "switch at their pace. 0 stops it (and any older one) signing at once: a leaked secret.",
    )


def change_url(endpoint: WebhookEndpoint) -> str:
    return reverse("admin:jobstate_webhookendpoint_change", args=[endpoint.pk])


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def show_once(request: HttpRequest, endpoint: WebhookEndpoint, next_url: str) -> HttpResponseRedirect:
    """Grant this session one look at ``endpoint``'s current secret and go to it;
    the page's *Continue* leads to ``next_url``."""
    grants = dict(request.session.get(SESSION_KEY, {}))
    grants[str(endpoint.pk)] = [_digest(endpoint.secret), next_url]
    request.session[SESSION_KEY] = grants
    return HttpResponseRedirect(reverse("admin:jobstate_webhookendpoint_secret", args=[endpoint.pk]))


def secret_view(model_admin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """The secret, if this session was granted a look at it (and it has not changed since)."""
    endpoint = _endpoint(model_admin, request, object_id)
    grants = dict(request.session.get(SESSION_KEY, {}))
    grant = grants.pop(str(endpoint.pk), None)
    if grant is not None:
        request.session[SESSION_KEY] = grants
    # A rotation since the grant made another secret, which this look was not for.
    shown = grant is not None and hmac.compare_digest(grant[0], _digest(endpoint.secret))
    return TemplateResponse(
        request,
        SECRET_PAGE,
        page_context(
            model_admin,
            request,
            f"The signing secret of {endpoint}",
            original=endpoint,
            secret=endpoint.secret if shown else None,
            next_url=grant[1] if grant is not None else change_url(endpoint),
        ),
    )


def rotate_view(model_admin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: the form asking for the overlap. POST: rotate, then show the new secret once."""
    endpoint = _endpoint(model_admin, request, object_id)
    if not model_admin.has_change_permission(request, endpoint):
        raise PermissionDenied
    initial = {"overlap_seconds": int(conf.get("WEBHOOK_SECRET_OVERLAP_SECONDS"))}
    form = RotateForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint = rotation.rotate(endpoint.pk, form.cleaned_data["overlap_seconds"])
        except rotation.RotationRefused as exc:
            form.add_error(None, str(exc))
        except WebhookEndpoint.DoesNotExist:
            raise Http404("No such webhook endpoint.") from None
        else:
            model_admin.log_change(request, endpoint, [{"changed": {"fields": ["signing secret"]}}])
            return show_once(request, endpoint, change_url(endpoint))
    title = f"Rotate the signing secret of {endpoint}"
    return TemplateResponse(
        request, ROTATE_PAGE, page_context(model_admin, request, title, original=endpoint, form=form)
    )


def _endpoint(model_admin: Any, request: HttpRequest, object_id: str) -> WebhookEndpoint:
    endpoint: WebhookEndpoint | None = model_admin.get_object(request, object_id)  # None outside scope
    if endpoint is None or not model_admin.has_view_or_change_permission(request, endpoint):
        raise Http404("No such webhook endpoint.")
    return endpoint
