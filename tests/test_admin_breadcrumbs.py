"""jobstate's own admin pages write their breadcrumbs as the running Django's admin
does: a list on Django 6, a div with &rsaquo; on 5.2 (tests.admin_support.breadcrumbs
checks the markup by the version). They wrote 5.2's on Django 6 too."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from jobstate.ids import short
from jobstate.webhooks.models import WebhookEndpoint
from tests.admin_support import breadcrumbs, queued

pytestmark = pytest.mark.django_db

APP = ["Home", "Background jobs"]
JOBS = [*APP, "Jobs"]


def test_the_job_pages_write_the_running_djangos_breadcrumbs(admin_client: Any) -> None:
    job = queued()
    name = f"{job.kind} {job.pk}"
    gets = {
        reverse("admin:jobstate_job_changelist"): JOBS,  # Django's own template
        reverse("admin:jobstate_job_dashboard"): [*APP, "Dashboard"],
        reverse("admin:jobstate_job_stuck"): [*JOBS, "Stuck jobs"],
        reverse("admin:jobstate_job_change", args=[job.pk]): [*JOBS, name],
        reverse("admin:jobstate_job_transition", args=[job.pk, "cancel"]): [
            *JOBS,
            f"{job.kind} {short(job.pk)}",
            "Cancel",
        ],
    }
    for url, expected in gets.items():
        assert breadcrumbs(admin_client.get(url).content.decode()) == expected, url
    reap = admin_client.post(reverse("admin:jobstate_job_reap")).content.decode()
    assert breadcrumbs(reap) == [*APP, "Stuck jobs", "Run the reaper now"]
    for view, verb in (("pause", "Pause"), ("resume", "Resume")):
        page = admin_client.get(reverse(f"admin:jobstate_job_{view}_kind"), {"kind": job.kind})
        assert breadcrumbs(page.content.decode()) == [*APP, "Dashboard", f"{verb} a kind"], view
    data = {"action": "cancel_selected", "_selected_action": [str(job.pk)], "index": 0}
    bulk = admin_client.post(reverse("admin:jobstate_job_changelist"), data).content.decode()
    assert breadcrumbs(bulk) == [*JOBS, "Cancel"]


def test_the_webhook_secret_pages_write_the_running_djangos_breadcrumbs(admin_client: Any, user: Any) -> None:
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/crumbs")
    # The rotate page's ended "Signing secret" too, the name of the page it leads to.
    crumbs = [*APP, "Webhook endpoints", endpoint.url]
    for view, current in (("secret", "Signing secret"), ("rotate_secret", "Rotate secret")):
        html = admin_client.get(reverse(f"admin:jobstate_webhookendpoint_{view}", args=[endpoint.pk]))
        assert breadcrumbs(html.content.decode()) == [*crumbs, current], view
