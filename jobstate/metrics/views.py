"""``metrics/``: the Prometheus text exposition, behind METRICS_ACCESS."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jobstate import conf
from jobstate.metrics.collector import registry
from jobstate.models.job import may_view_all

_registry = None


def allowed(request: HttpRequest) -> bool:
    access = conf.get("METRICS_ACCESS")
    if access == "open":
        return True
    # HTTP strips a header value's surrounding whitespace, so a token read from a secret
    # file with its final newline would never match: it is compared without it.
    token = str(conf.get("METRICS_TOKEN") or "").strip()
    # The scheme is case-insensitive, then one or more spaces (RFC 9110 section 11.1).
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    credentials = credentials.lstrip(" ")
    # A blank token is none: "Bearer " would match it (jobstate.E007).
    if token and scheme.lower() == "bearer" and hmac.compare_digest(credentials.encode(), token.encode()):
        return True
    if access == "staff":
        # Counts by kind and status are about every user's jobs: those who may see them all.
        return may_view_all(getattr(request, "user", None))
    return False


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    global _registry
    if not allowed(request):
        user = getattr(request, "user", None)
        if request.headers.get("Authorization") or (user is not None and user.is_authenticated):
            return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
        response = HttpResponse("Authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if _registry is None:
        _registry = registry()
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
