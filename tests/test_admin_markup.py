"""jobstate's own admin markup is written as the running Django's admin writes its own:
the job list's paginator and search form (overrides of Django's, for the capped count),
on Django 6 a nav with a hidden heading and a list, and a search form named by a hidden
heading; the links of the submit rows of jobstate's own pages, on Django 6 marked
``role="button"``. They wrote Django 5.2's on Django 6 too."""

from __future__ import annotations

import re
from typing import Any

import django
import pytest
from django.contrib import admin
from django.urls import reverse

from jobstate.models import Job, JobEvent
from jobstate.webhooks.models import WebhookEndpoint
from tests.admin_support import completed, queued

pytestmark = pytest.mark.django_db

LISTS = django.VERSION >= (6, 0)
BUTTONS = django.VERSION >= (6, 0)  # a submit row's links: role="button"


def paginator(html: str) -> tuple[str, str, bool]:
    """The paginator's element, its heading (none: "") and whether its pages are list items."""
    match = re.search(r'<(nav|p) class="paginator"[^>]*>\s*(<h2[^>]*>)?', html)
    assert match is not None, "no paginator"
    end = html.index(f"</{match.group(1)}>", match.end())
    return match.group(0).split(">")[0] + ">", match.group(2) or "", "<li><a " in html[match.end() : end]


def search_form(html: str) -> tuple[str, str]:
    """The search form's opening tag and its heading (none: "")."""
    toolbar = r'<div id="toolbar">\s*(<h2[^>]*>)?[^<]*(?:</h2>)?\s*(<form id="changelist-search"[^>]*>)'
    match = re.search(toolbar, html)
    assert match is not None, "no search form"
    return match.group(2), match.group(1) or ""


def test_the_job_lists_paginator_is_the_running_djangos(admin_client: Any, monkeypatch: Any) -> None:
    for model in (Job, JobEvent):  # JobEvent's list: Django's own template
        monkeypatch.setattr(admin.site._registry[model], "list_per_page", 1)
    queued(), queued()
    jobs = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    events = admin_client.get(reverse("admin:jobstate_jobevent_changelist")).content.decode()
    assert paginator(jobs) == paginator(events)
    if LISTS:
        assert paginator(jobs) == (
            '<nav class="paginator" aria-labelledby="pagination">',
            '<h2 id="pagination" class="visually-hidden">',
            True,
        )
        assert '<h2 id="pagination" class="visually-hidden">Pagination jobs</h2>' in jobs
    else:
        assert paginator(jobs) == ('<p class="paginator">', "", False)


def test_the_job_lists_search_form_is_the_running_djangos(admin_client: Any, user: Any) -> None:
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/markup")
    jobs = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    endpoints = admin_client.get(reverse("admin:jobstate_webhookendpoint_changelist")).content.decode()
    assert search_form(jobs) == search_form(endpoints)  # the endpoints': Django's own template
    if LISTS:
        assert '<h2 id="changelist-search-form" class="visually-hidden">Search jobs</h2>' in jobs
        assert 'aria-labelledby="changelist-search-form"' in search_form(jobs)[0]
    else:
        assert search_form(jobs) == ('<form id="changelist-search" method="get" role="search">', "")


def submit_row_links(html: str) -> list[str]:
    """The opening tags of the links in the page's submit rows."""
    rows = re.findall(r'<div class="submit-row"[^>]*>(.*?)</div>', html, re.S)
    return [tag for row in rows for tag in re.findall(r"<a\b[^>]*>", row)]


def test_the_links_of_jobstates_submit_rows_are_the_running_djangos(admin_client: Any, user: Any) -> None:
    job, done = queued(), completed()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/markup")
    jobs = reverse("admin:jobstate_job_changelist")
    pages = {
        "transition": admin_client.get(reverse("admin:jobstate_job_transition", args=[job.pk, "cancel"])),
        "reaper": admin_client.post(reverse("admin:jobstate_job_reap")),
        "bulk": admin_client.post(
            jobs, {"action": "cancel_selected", "_selected_action": [job.pk], "index": 0}
        ),
        "bulk, nothing to confirm": admin_client.post(
            jobs, {"action": "cancel_selected", "_selected_action": [done.pk], "index": 0}
        ),
        "rotate": admin_client.get(
            reverse("admin:jobstate_webhookendpoint_rotate_secret", args=[endpoint.pk])
        ),
        "secret": admin_client.get(reverse("admin:jobstate_webhookendpoint_secret", args=[endpoint.pk])),
    }
    for name, response in pages.items():
        links = submit_row_links(response.content.decode())
        assert links, name
        assert all(('role="button"' in tag) == BUTTONS for tag in links), (name, links)
