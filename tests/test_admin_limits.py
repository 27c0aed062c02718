"""The admin under hostile or heavy input: filters with NUL characters or
impossible dates answer with the normal page, and a job with thousands of
transitions or assets shows the latest ones with a link to the full list."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse

from jobstate import services
from jobstate.ids import short
from jobstate.models import Asset, JobEvent
from tests.admin_support import expired, grant, queued

pytestmark = pytest.mark.django_db

LIST = reverse("admin:jobstate_job_changelist")


def change_url(job: Any) -> str:
    return reverse("admin:jobstate_job_change", args=[job.pk])


def test_nul_characters_are_ignored_in_filters(admin_client: Any) -> None:
    job = queued(kind="test.limited")
    for query in ("kind=%00", "kind=test.echo%00", "kind%00=test.echo"):
        response = admin_client.get(f"{LIST}?{query}")
        assert response.status_code == 200, query
        assert short(job.pk) in response.content.decode(), query  # the filter was ignored


def test_date_hierarchy_with_a_month_or_day_but_no_year(admin_client: Any) -> None:
    job = queued()
    day = job.created_at
    response = admin_client.get(f"{LIST}?created_at__month={day.month}")
    assert response.status_code == 200
    html = response.content.decode()
    assert short(job.pk) in html  # Django filters every year's month
    assert f"created_at__year={day.year}" in html  # and the hierarchy offers the year level
    other_month = day.month % 12 + 1
    response = admin_client.get(f"{LIST}?created_at__month={other_month}&created_at__day=5")
    assert response.status_code == 200 and short(job.pk) not in response.content.decode()
    # Django reads a day without a month as a day of January; the months level shows.
    response = admin_client.get(f"{LIST}?created_at__year={day.year}&created_at__day=5")
    assert response.status_code == 200 and 'id="changelist"' in response.content.decode()


def test_job_page_shows_the_latest_transitions_and_assets_with_a_link_to_all(
    admin_client: Any, user: Any
) -> None:
    job = queued(user)
    start = job.created_at
    JobEvent.objects.bulk_create(
        JobEvent(
            job=job,
            from_status="queued",
            to_status="queued",
            transition="note",
            actor_label="test",
            reason=f"note {i:03d}",
            created_at=start + timedelta(seconds=i + 1),
        )
        for i in range(120)
    )
    Asset.objects.bulk_create(
        Asset(
            job=job,
            owner=user,
            asset_type="link",
            name=f"part-{i:03d}.json",
            url=f"https://example.org/{i:03d}.json",
            created_at=start + timedelta(seconds=i),
        )
        for i in range(70)
    )
    html = admin_client.get(change_url(job)).content.decode()
    # The 50 newest of 121 transitions (the enqueue and notes 000-069 are left out), oldest first.
    assert "note 070" in html and "note 119" in html and "note 069" not in html
    assert html.index("note 070") < html.index("note 119")
    assert html.count('class="field-transition"') == 50
    assert "Showing the latest 50 of 121 transitions." in html
    events = reverse("admin:jobstate_jobevent_changelist")
    assert f'href="{events}?job={job.pk}"' in html
    assert "part-020.json" in html and "part-069.json" in html and "part-019.json" not in html
    assert "Showing the latest 50 of 70 assets." in html
    assert f'href="{LIST.replace("job/", "asset/")}?job={job.pk}"' in html
    # A job with a short history shows all of it, without the notice.
    small = admin_client.get(change_url(queued(user))).content.decode()
    assert "Showing the latest" not in small and small.count('class="field-transition"') == 1


def test_the_full_history_list_of_one_job(
    client: Any, admin_client: Any, viewer: Any, staff_user: Any
) -> None:
    job = queued()
    services.request_cancel(job, "ops", "no longer needed")
    other = queued()
    url = reverse("admin:jobstate_jobevent_changelist")
    client.force_login(viewer)
    response = client.get(f"{url}?job={job.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "no longer needed" in html and change_url(job) in html and change_url(other) not in html
    assert html.index("no longer needed") < html.index('field-transition">enqueue')  # newest first
    assert client.get(f"{url}?job=not-a-uuid").status_code in (200, 302)
    assert client.get(f"{url}?job=%00").status_code == 200
    assert client.get(reverse("admin:jobstate_jobevent_add")).status_code == 403
    assert "/jobevent/" not in client.get(reverse("admin:index")).content.decode()  # reached from jobs
    client.force_login(staff_user)  # staff without any jobstate permission
    assert client.get(url).status_code == 403
    # Append-only: not even a superuser deletes a transition (only with its finished job).
    event = JobEvent.objects.filter(job=job).first()
    delete = reverse("admin:jobstate_jobevent_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert JobEvent.objects.filter(pk=event.pk).exists()
    page = admin_client.get(reverse("admin:jobstate_jobevent_change", args=[event.pk]))
    assert page.status_code == 200 and delete not in page.content.decode()


def test_the_history_list_needs_the_job_view_permission(client: Any, staff_user: Any) -> None:
    # Its rows are the jobs' (kind, reasons, actors): view_jobevent alone shows none.
    job = queued()
    services.request_cancel(job, "ops", "no longer needed")
    url = f"{reverse('admin:jobstate_jobevent_changelist')}?job={job.pk}"
    client.force_login(grant(staff_user, "view_jobevent"))
    assert client.get(url).status_code == 403
    client.force_login(grant(staff_user, "change_job"))
    response = client.get(url)
    assert response.status_code == 200 and "no longer needed" in response.content.decode()


def test_nul_characters_in_posted_reasons_are_dropped(admin_client: Any) -> None:
    job = queued()
    data = {
        "action": "cancel_selected",
        "_selected_action": [str(job.pk)],
        "confirm": "yes",
        "reason": "a\x00b",
    }
    assert admin_client.post(LIST, data).status_code == 302
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.transition, event.reason) == ("cancel", "ab")
    lost = expired()
    remedy = {"job": str(lost.pk), "operation": "requeue", "note": "host\x00 died"}
    assert admin_client.post(reverse("admin:jobstate_job_stuck_remedy"), remedy).status_code == 302
    event = JobEvent.objects.filter(job=lost).latest("id")
    assert (event.transition, event.reason) == (
        "requeue",
        "stuck remedy (lease expired (worker lost)): host died",
    )
    # A note that makes the reason too long is refused, not cut short: nothing is done.
    other_lost = expired()
    long_note = {"job": str(other_lost.pk), "operation": "requeue", "note": "x" * 1000}
    response = admin_client.post(reverse("admin:jobstate_job_stuck_remedy"), long_note, follow=True)
    assert "The note is too long" in response.content.decode()
    assert JobEvent.objects.filter(job=other_lost).count() == 2  # enqueued and claimed, no requeue
    # The confirmation form of the job page refuses them, as any Django form field does.
    other = queued()
    page = admin_client.post(
        reverse("admin:jobstate_job_transition", args=[other.pk, "cancel"]), {"reason": "a\x00"}
    )
    assert page.status_code == 200 and "Null characters are not allowed." in page.content.decode()
    assert JobEvent.objects.filter(job=other).count() == 1
