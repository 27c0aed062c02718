"""Query counts of admin pages that must not grow with their rows, nor repeat
a query a page already made."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path

from jobstate.admin.job_columns import JobColumns
from jobstate.models import Job
from tests.admin_support import processing, queued

pytestmark = pytest.mark.django_db


class HostJobAdmin(JobColumns, admin.ModelAdmin):  # type: ignore[type-arg]
    """A host project's own job list reusing the columns, with Django's ChangeList."""

    list_display = ("short_id", "status_col", "kind", "age_col")
    ordering = ("-created_at",)
    change_list_template = "admin/change_list.html"  # Django's: jobstate's links to its own pages


host_site = AdminSite(name="host")
host_site.register(Job, HostJobAdmin)
urlpatterns = [path("host/", host_site.urls)]
HOST_LIST = "/host/jobstate/job/"


def queries(client: Any, url: str) -> list[str]:
    client.get(url)  # warm the session and caches
    with CaptureQueriesContext(connection) as seen:
        response = client.get(url)
        assert response.status_code == 200
    return [q["sql"] for q in seen.captured_queries]


@override_settings(ROOT_URLCONF=__name__)
def test_a_host_list_of_the_status_column_shares_one_stuck_context(admin_client: Any) -> None:
    # Without the job list's own ChangeList no row carries a shared context: one
    # built per row read the database's clock (PostgreSQL) and the served kinds again.
    def grow(n: int) -> None:
        for _ in range(n):
            queued()
            processing()

    grow(1)
    few = queries(admin_client, HOST_LIST)
    grow(9)
    many = queries(admin_client, HOST_LIST)
    assert admin_client.get(HOST_LIST).content.decode().count('class="js-badge') == 20
    assert len(many) == len(few), many
    assert sum("STATEMENT_TIMESTAMP()" in q for q in many) <= 1, many  # PostgreSQL's clock, read once
