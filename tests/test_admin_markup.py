"""jobstate's own admin markup is written as the running Django's admin writes its own:
the job list's paginator and search form (overrides of Django's, for the capped count),
on Django 6 a nav with a hidden heading and a list, and a search form named by a hidden
heading; the links of the submit rows of jobstate's own pages, on Django 6 marked
``role="button"``; the form rows of jobstate's reason and overlap forms, on Django 6 with
the help and errors inside the ``.flex-container``. They wrote Django 5.2's on Django 6 too."""

from __future__ import annotations

import re
from html.parser import HTMLParser
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


class RowShapes(HTMLParser):
    """The layout of each form row: its containers, help, errors, label and field, each
    as (depth, what), the rest left out; and the field its label is for."""

    KEPT = ("form-row", "flex-container", "errors", "help", "errorlist")
    VOID = ("input", "br", "img")

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.start = 0, -1
        self.rows: dict[str, list[tuple[int, str]]] = {}
        self.shape: list[tuple[int, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if self.start < 0 and "form-row" in classes:
            self.start, self.shape = self.depth, []
        if self.start >= 0:
            kept = [c for c in classes if c in self.KEPT]
            what = {"textarea": "field", "select": "field", "input": "field", "label": "label"}.get(tag)
            if tag == "input" and attributes.get("type") == "hidden":
                what = None  # a JSON field's initial value
            if tag == "label":
                self.rows[str(attributes.get("for"))] = self.shape
            if kept or what:
                self.shape.append((self.depth - self.start, what or " ".join(kept)))
        if tag not in self.VOID:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID:
            self.depth -= 1
        if self.depth == self.start:
            self.start = -1


def row_shape(html: str, name: str) -> list[tuple[int, str]]:
    """The layout of the form row of the field ``name``."""
    parser = RowShapes()
    parser.feed(html)
    assert f"id_{name}" in parser.rows, f"no form row for {name}"
    return parser.rows[f"id_{name}"]


def test_jobstates_form_rows_are_laid_out_as_the_running_djangos(admin_client: Any, user: Any) -> None:
    # Django's own: an endpoint's events (a field with help text) refused.
    own = {"url": "https://hooks.example.com/markup", "events": "[", "kinds": "[]", "enabled": "on"}
    django_row = row_shape(
        admin_client.post(reverse("admin:jobstate_webhookendpoint_add"), own).content.decode(), "events"
    )
    if LISTS:  # the help and the errors in the .flex-container, which has the errors class
        expected = django_row
        assert expected[:5] == [
            (0, "form-row"),
            (1, "flex-container errors"),
            (2, "label"),
            (2, "help"),
            (2, "errorlist"),
        ]
    else:  # the errors beside it, in the row that has the errors class (one field a row: no wrapper)
        assert (0, "form-row errors") in django_row and (1, "errorlist") in django_row
        expected = [
            (0, "form-row errors"),
            (1, "errorlist"),
            (1, "flex-container"),
            (2, "label"),
            (2, "field"),
            (1, "help"),
        ]
    job = queued()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/markup")
    jobs = reverse("admin:jobstate_job_changelist")
    refused = {"action": "cancel_selected", "_selected_action": [job.pk], "index": 0, "confirm": "yes"}
    ours = {
        "reason": admin_client.post(
            reverse("admin:jobstate_job_transition", args=[job.pk, "cancel"]), {"reason": ""}
        ),
        "bulk reason": admin_client.post(jobs, {**refused, "reason": ""}),
        "overlap_seconds": admin_client.post(
            reverse("admin:jobstate_webhookendpoint_rotate_secret", args=[endpoint.pk]),
            {"overlap_seconds": "-1"},
        ),
    }
    for name, response in ours.items():
        html = response.content.decode()
        field = f"id_{name.split()[-1]}"
        # The help is the one the field's aria-describedby names: it had no id.
        assert f'aria-describedby="{field}_helptext {field}_error"' in html, name
        assert f'<div class="help" id="{field}_helptext">' in html, name
        assert row_shape(html, name.split()[-1]) == expected, name
