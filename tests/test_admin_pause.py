"""Pausing and resuming a kind from the admin dashboard; the list of pauses."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from jobstate import services
from jobstate.models import KindPause
from tests.admin_support import grant

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:jobstate_job_dashboard")
PAUSE = reverse("admin:jobstate_job_pause_kind")
RESUME = reverse("admin:jobstate_job_resume_kind")


def said(response: Any) -> str:
    """The last message the response left (the earlier ones wait for a page to show them)."""
    return [str(m) for m in get_messages(response.wsgi_request)][-1]


def test_pause_from_the_dashboard_then_resume_with_a_confirmation_each(admin_client: Any, admin_user: Any):
    services.enqueue("test.echo", {})
    page = admin_client.get(DASHBOARD).content.decode()
    assert f'href="{PAUSE}?kind=test.echo"' in page and "js-panel-paused" not in page
    confirm = admin_client.get(PAUSE, {"kind": "test.echo"})
    assert confirm.status_code == 200 and "<h1>Pause test.echo?</h1>" in confirm.content.decode()
    assert "No worker claims its <strong>1</strong> queued job, nor the ones" in confirm.content.decode()
    assert not KindPause.objects.exists()  # a GET changes nothing
    # The reason is asked for a pause.
    blank = admin_client.post(PAUSE, {"kind": "test.echo", "reason": " "})
    assert blank.status_code == 200 and "Give a reason." in blank.content.decode()
    assert not KindPause.objects.exists()
    done = admin_client.post(PAUSE, {"kind": "test.echo", "reason": "mail API down"})
    assert (
        done.status_code == 302
        and said(done) == "Paused test.echo: no worker claims its jobs until it is resumed."
    )
    pause = KindPause.objects.get()
    assert (pause.paused_by, pause.paused_by_label, pause.reason) == (admin_user, "admin", "mail API down")
    page = admin_client.get(DASHBOARD).content.decode()
    panel = page.split('id="js-panel-paused"', 1)[1].split("</section>", 1)[0]
    assert "test.echo" in panel and "admin (admin)" in panel and "mail API down" in panel
    assert '<td style="text-align: right;">1</td>' in panel  # one queued
    assert 'class="js-resume-kind"' in panel
    again = admin_client.post(PAUSE, {"kind": "test.echo", "reason": "me too"})
    assert said(again).startswith("Pause refused: 'test.echo' is already paused (by admin (admin) since")
    confirm = admin_client.get(RESUME, {"kind": "test.echo"}).content.decode()
    assert "<h1>Resume test.echo?</h1>" in confirm
    assert '<p id="js-kind-pause-text">Paused by admin (admin) since' in confirm
    assert "Its <strong>1</strong> queued job is claimed again" in confirm
    done = admin_client.post(RESUME, {"kind": "test.echo", "reason": ""})  # optional for a resume
    assert said(done) == "Resumed test.echo: its queued jobs are claimed again."
    assert KindPause.objects.get().resumed_by_label == "admin"
    again = admin_client.post(RESUME, {"kind": "test.echo"})
    assert said(again) == "Resume refused: 'test.echo' is not paused"
    typo = admin_client.post(PAUSE, {"kind": "test.ecoh", "reason": "x"})
    assert said(typo) == "Pause refused: no kind 'test.ecoh' is registered or has jobs."
    listed = admin_client.get(reverse("admin:jobstate_kindpause_changelist")).content.decode()
    assert "test.echo" in listed and "resumed" in listed


def test_a_reason_that_ends_its_sentence_gets_no_second_full_stop(admin_client: Any):
    services.pause_kind("test.echo", "ops", "mail API down.")
    confirm = admin_client.get(RESUME, {"kind": "test.echo"}).content.decode()
    assert ": mail API down. It has no queued job now." in confirm


def test_only_staff_who_may_change_jobs_pause_or_resume(client: Any, django_user_model: Any):
    viewer = grant(django_user_model.objects.create_user("v", password="pw", is_staff=True), "view_job")
    client.force_login(viewer)
    assert 'class="js-pause-kind"' not in client.get(DASHBOARD).content.decode()
    assert client.get(PAUSE, {"kind": "test.echo"}).status_code == 403
    assert client.post(PAUSE, {"kind": "test.echo", "reason": "x"}).status_code == 403
    services.pause_kind("test.echo", "ops", "incident")
    assert client.post(RESUME, {"kind": "test.echo"}).status_code == 403
    page = client.get(DASHBOARD).content.decode()
    assert "js-panel-paused" in page and "js-resume-kind" not in page  # seen, no button
    assert KindPause.objects.get().active
    grant(viewer, "change_job")
    assert client.post(RESUME, {"kind": "test.echo", "reason": "over"}).status_code == 302
    assert not KindPause.objects.get().active


def test_a_pause_posted_without_the_csrf_token_is_refused(admin_user: Any):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(PAUSE, {"kind": "test.echo", "reason": "x"}).status_code == 403
    assert not KindPause.objects.exists()


def test_the_list_of_pauses_links_to_the_resume_of_a_kind_whatever_its_name(admin_client: Any):
    kind = "reports & exports+csv #2"  # a kind name may hold any printable character
    KindPause.objects.create(kind=kind, paused_by_label="ops")
    listed = admin_client.get(reverse("admin:jobstate_kindpause_changelist")).content.decode()
    href = re.search(r'<a href="([^"]*)">resume</a>', listed)
    assert href is not None
    confirm = admin_client.get(html.unescape(href.group(1))).content.decode()
    assert f"<h1>Resume {html.escape(kind)}?</h1>" in confirm and "Paused by ops since" in confirm


def test_a_confirmation_that_would_be_refused_says_so_and_offers_only_the_way_back(admin_client: Any):
    # It offered the pause (or resume) anyway, and its POST was then refused.
    services.pause_kind("test.echo", "ops", "mail API down")
    for url, kind, refusal in (
        (PAUSE, "test.echo", "Pause refused: 'test.echo' is already paused (by ops since"),
        (PAUSE, "no.such.kind", "Pause refused: No kind 'no.such.kind' is registered or has jobs."),
        (RESUME, "test.schema", "Resume refused: 'test.schema' is not paused."),
        (PAUSE, "", "Pause refused: No kind given."),
    ):
        page = html.unescape(admin_client.get(url, {"kind": kind}).content.decode())
        assert refusal in page, (url, kind)
        assert 'id="js-confirm"' not in page and "Go back" in page
    offered = admin_client.get(RESUME, {"kind": "test.echo"}).content.decode()
    assert (
        'id="js-confirm"' in offered
        and "Kept in the pause&#x27;s record with your user name. Optional." in offered
    )


def test_a_kind_with_a_nul_character_is_refused_not_a_server_error(admin_client: Any):
    # PostgreSQL refuses a NUL in a query: the page answered 500.
    for url in (PAUSE, RESUME):
        page = admin_client.get(url, {"kind": "a\x00b"})
        assert page.status_code == 200 and 'id="js-confirm"' not in page.content.decode()
        posted = admin_client.post(url, {"kind": "a\x00b", "reason": "x"})
        assert posted.status_code in (200, 302) and not KindPause.objects.exists()


def test_the_pause_confirmation_counts_in_words_and_does_not_repeat_its_heading(
    admin_client: Any, admin_user: Any
):
    """Under the heading "Pause test.echo?" it said "Pause test.echo? No worker claims its
    2 queued job(s)"."""
    for _ in range(2):
        services.enqueue("test.echo", {})

    def text(url: str, kind: str) -> str:
        page = admin_client.get(url, {"kind": kind}).content.decode()
        found = re.search(r'<p id="js-kind-pause-text">(.*?)</p>', page, re.S)
        assert found is not None, page
        return " ".join(found.group(1).split())

    assert text(PAUSE, "test.echo") == (
        "No worker claims its <strong>2</strong> queued jobs, nor the ones enqueued meanwhile, "
        "until it is resumed; they stay queued. Its jobs already running finish."
    )
    assert text(PAUSE, "test.limited").startswith("It has no queued job now; no worker claims")
    services.pause_kind("test.echo", admin_user, "mail API down")
    resume = text(RESUME, "test.echo")
    assert resume.startswith("Paused by user:admin (admin) since ") and resume.endswith(
        ": mail API down. Its <strong>2</strong> queued jobs are claimed again by the workers that serve it."
    )
