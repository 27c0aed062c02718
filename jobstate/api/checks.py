"""System check (``manage.py check``): the REST API's URLs are mounted while an
app its pages need is not installed. Without it the project starts and the
pages fail only when served: the browsable API, its filter forms and the Swagger
UI look for those apps' templates (a 500 for every HTML request)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error, register
from django.urls import get_resolver

from jobstate import conf

# What each app gives the API's pages (the hint names it).
NEEDED = {
    "rest_framework": "the browsable API's templates",
    "django_filters": "the list filters' form templates",
    "drf_spectacular": "the Swagger UI page's template",
}


def api_mounted() -> bool:
    """Whether the URLconf includes ``jobstate.api.urls`` (its app name), at any depth."""
    return "jobstate-api" in get_resolver().app_dict


@register("jobstate", "urls")
def check_api_apps(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        mounted = api_mounted()
    except Exception:  # a URLconf that fails to import is reported by Django's own check
        return []
    if not mounted:
        return []
    return [
        Error(
            f"The jobstate API's URLs are mounted but {app!r} is not in INSTALLED_APPS: "
            f"its pages need {what}.",
            hint=f"Add {app!r} to INSTALLED_APPS. {conf.CHECKS_DOCS}",
            id="jobstate.E008",
        )
        for app, what in NEEDED.items()
        if not apps.is_installed(app)
    ]
