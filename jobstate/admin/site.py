"""The jobstate entries of the admin's app list: the dashboard and the stuck page.

They are added to the app's entry ("Background jobs") of ``AdminSite.get_app_list``, so the admin
index, the app page and the navigation sidebar show them inside the app's own
box, whatever the order of INSTALLED_APPS and without overriding a template.
``JobAdmin`` installs this on the site it is registered with (a custom
``AdminSite`` included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from jobstate.models import Job

# (entry name, URL name, object_name used for the row's CSS class "model-<name>")
LINKS = (
    ("Dashboard", "jobstate_job_dashboard", "JobstateDashboard"),
    ("Stuck jobs", "jobstate_job_stuck", "JobstateStuck"),
)

_MARK = "_jobstate_app_list"


def link_entries(site: AdminSite, request: HttpRequest) -> list[dict[str, Any]]:
    model_admin = site._registry.get(Job)
    if model_admin is None or not model_admin.has_view_permission(request):
        return []
    entries = []
    for name, url_name, object_name in LINKS:
        try:
            url = reverse(f"{site.name}:{url_name}", current_app=site.name)
        except NoReverseMatch:
            continue
        entries.append(
            {
                "model": Job,
                "name": name,
                "object_name": object_name,
                "perms": {"add": False, "change": False, "delete": False, "view": True},
                "admin_url": url,
                "add_url": None,
                "view_only": True,
            }
        )
    return entries


def install(site: AdminSite) -> None:
    """Wrap ``site.get_app_list`` once so the jobstate app lists its pages first."""
    if getattr(site, _MARK, False):
        return
    original: Callable[..., list[dict[str, Any]]] = site.get_app_list

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        app_list = original(request, app_label)
        for app in app_list:
            if app.get("app_label") == Job._meta.app_label:
                app["models"][:0] = link_entries(site, request)
        return app_list

    site.get_app_list = get_app_list  # type: ignore[method-assign]
    setattr(site, _MARK, True)
