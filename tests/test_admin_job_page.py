"""The job page's layout: the summary, then the history; sections only when they hold something."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from jobstate import services
from tests.admin_support import breadcrumbs, completed, failed, processing, queued

pytestmark = pytest.mark.django_db


def sections(admin_client: Any, job: Any) -> list[str]:
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    form = html[html.index('id="job_form"') :]
    return [
        t.strip()
        for t in re.findall(
            r'<h2[^>]*class="[^"]*(?:fieldset-heading|inline-heading)[^"]*"[^>]*>([^<]+)', form
        )
    ]


def test_queued_job_has_no_error_result_or_lease(admin_client: Any) -> None:
    assert sections(admin_client, queued()) == ["Transition history", "Parameters"]


def test_running_job_shows_its_lease_and_an_earlier_error(admin_client: Any) -> None:
    job = processing()
    assert sections(admin_client, job) == ["Transition history", "Parameters", "Lease"]
    services.fail(job, job.lease_token, "flaky", retry_delay=0)
    job = services.start(job, "w-2")
    assert sections(admin_client, job) == ["Transition history", "Last error", "Parameters", "Lease"]


def test_assets_only_when_there_are_some(admin_client: Any, settings: Any, tmp_path: Any) -> None:
    settings.MEDIA_ROOT = tmp_path
    job = processing()
    services.add_asset(job, asset_type="report", name="a.csv", content=b"a\n", token=job.lease_token)
    assert sections(admin_client, job) == ["Transition history", "Assets", "Parameters", "Lease"]


def test_finished_jobs(admin_client: Any) -> None:
    assert sections(admin_client, completed()) == ["Transition history", "Result", "Parameters"]
    assert sections(admin_client, failed()) == ["Transition history", "Error", "Parameters"]


def test_cancel_requested_shows_the_lease_with_the_request(admin_client: Any) -> None:
    job = processing()
    services.request_cancel(job, None, "stop")
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert "field-cancel_requested_at_display" in html and "Lease" in html


def test_the_lease_token_is_shown_by_its_first_characters_only(
    client: Any, viewer: Any, admin_client: Any
) -> None:
    # The page showed the whole token, the worker's credential for every write to the job
    # (progress, heartbeat, outcome), to anyone who may view jobs.
    job = processing()
    token = str(job.lease_token)
    client.force_login(viewer)
    for user_client in (client, admin_client):
        page = user_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
        assert f"<code>{token[:8]}…</code>" in page and token not in page
        surfaces = [
            reverse("admin:jobstate_job_changelist"),
            reverse("admin:jobstate_job_live") + f"?ids={job.pk}",
        ]
        for url in surfaces:
            response = user_client.get(url)
            assert response.status_code == 200 and token not in response.content.decode()
    cancel = reverse("admin:jobstate_job_transition", args=[job.pk, "cancel"])
    response = admin_client.get(cancel)
    assert response.status_code == 200 and token not in response.content.decode()


def test_history_is_in_id_order_even_when_clocks_disagree(admin_client: Any) -> None:
    import datetime as dt

    from jobstate.models import JobEvent

    job = failed()
    ids = list(JobEvent.objects.filter(job=job).order_by("id").values_list("id", flat=True))
    assert len(ids) >= 3
    # The last event carries the earliest time (a worker with a slow clock).
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, pk in enumerate(ids):
        JobEvent.objects.filter(pk=pk).update(created_at=base - dt.timedelta(seconds=i))
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    history = html[html.index("Transition history") :]
    shown = [int(pk) for pk in re.findall(r'name="events-\d+-id" value="(\d+)"', history)]
    assert shown == ids


def test_with_use_tz_false_the_page_its_live_refresh_and_the_list_show_times(
    admin_client: Any, settings: Any
) -> None:
    # Naive times went to timezone.localtime, which refuses them: the lease times read "-",
    # the live refresh and the job list answered 500.
    settings.USE_TZ = False
    job = services.start(queued(), "w-1")
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    lease = html[
        html.index("fieldBox field-lease_expires_display") : html.index("fieldBox field-lease_token")
    ]
    assert "(in " in lease and " ago)" in lease
    live = admin_client.get(reverse("admin:jobstate_job_live"), {"ids": str(job.pk)})
    assert live.status_code == 200
    assert " ago)" in live.json()["jobs"][str(job.pk)]["fields"]["heartbeat_display"]
    made = job.created_at
    for drill in (
        {},
        {"created_at__year": made.year},
        {"created_at__year": made.year, "created_at__month": made.month},
    ):
        listed = admin_client.get(reverse("admin:jobstate_job_changelist"), drill)
        assert listed.status_code == 200 and str(job.pk) in listed.content.decode()


def test_history_times_are_in_the_current_time_zone_as_the_rest_of_the_page(
    admin_client: Any, settings: Any
) -> None:
    # The history showed UTC (with no zone said) beside the summary's and lease's local times.
    from django.utils import timezone

    from jobstate.models import JobEvent

    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+05:30
    job = completed()
    first = JobEvent.objects.filter(job=job).order_by("id").first()
    assert first is not None
    local = timezone.localtime(first.created_at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    for url in (
        reverse("admin:jobstate_job_change", args=[job.pk]),
        reverse("admin:jobstate_jobevent_changelist") + f"?job={job.pk}",
    ):
        html = admin_client.get(url).content.decode()
        assert local in html, url


def test_summary_times_read_as_the_history_times(admin_client: Any, settings: Any) -> None:
    # The summary said "Nov. 30, 2026, 1:01 p.m." (to the minute) beside the history's
    # "2026-11-30 13:01:02.314": the start it showed could not be matched to its claim.
    from django.utils import timezone

    from jobstate.models import JobEvent

    settings.TIME_ZONE = "Asia/Kolkata"
    job = completed()
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()

    def shown(label: str) -> str:
        found = re.search(rf'<label[^>]*>{label}:</label>\s*<div class="readonly">([^<]*)</div>', html)
        assert found is not None, label
        return found.group(1).strip()

    def exact(moment: Any) -> str:
        return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    claim = JobEvent.objects.get(job=job, transition="claim")
    assert shown("Last run started") == exact(job.started_at)
    assert exact(claim.created_at) in html  # the history's row, in the same form
    assert shown("Created at") == exact(job.created_at)
    assert shown("Finished at") == exact(job.finished_at)


def test_an_asset_s_time_reads_as_the_page_s_other_times(
    admin_client: Any, settings: Any, tmp_path: Any
) -> None:
    # It read "Nov. 30, 2026, 1:22 p.m." (Django's, to the minute) under the history's
    # "2026-11-30 13:22:41.156".
    from django.utils import timezone

    settings.MEDIA_ROOT = tmp_path
    settings.TIME_ZONE = "Asia/Kolkata"
    job = processing()
    asset = services.add_asset(job, asset_type="report", name="a.csv", content=b"a\n", token=job.lease_token)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert timezone.localtime(asset.created_at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] in html
    assert "p.m." not in html and "a.m." not in html


def test_the_start_shown_is_named_the_last_runs(admin_client: Any) -> None:
    # It was "Started at", beside a history whose first claim is earlier: a job run
    # again keeps only its latest run's start.
    from datetime import timedelta

    from django.utils import timezone

    from tests.admin_support import ago

    job = processing(started=ago(minutes=5))
    services.fail(job, job.lease_token, "flaky", retry_delay=0)
    again = services.start(job, "w-2")
    assert again.started_at is not None and timezone.now() - again.started_at < timedelta(minutes=1)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert re.search(r"<label[^>]*>Last run started:</label>", html)
    assert "Started at:" not in html


def test_job_page_and_stuck_page_queries_do_not_grow_with_rows(admin_client: Any, admin_user: Any) -> None:
    # 2 rows of each kind against 20: children, history rows (with their actor), assets,
    # stuck jobs of three reasons. On PostgreSQL each stuck.Context() reads the
    # database's clock: one built per row would show here too.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobstate.models import Job
    from jobstate.services import Actor
    from tests.admin_support import ago, expired

    parent = processing(admin_user)
    pages = [
        reverse("admin:jobstate_job_change", args=[parent.pk]),
        reverse("admin:jobstate_job_stuck"),
    ]

    def grow(n: int) -> None:
        for _ in range(n):
            queued(admin_user, parent=parent)  # children
            services.add_asset(parent, asset_type="report", name="r.csv", content=b"x")
            services.request_stop(parent, Actor.admin(admin_user), "history row")
            Job.objects.filter(pk=parent.pk).update(stop_requested_at=None)
            expired(admin_user)
            failed(admin_user)
            stale = queued(admin_user, kind="test.limited")  # no worker serves that kind
            Job.objects.filter(pk=stale.pk).update(run_after=ago(hours=1))

    def counts() -> list[int]:
        found = []
        for url in pages:
            admin_client.get(url)  # warm the session and caches
            with CaptureQueriesContext(connection) as seen:
                assert admin_client.get(url).status_code == 200
            found.append(len(seen))
        return found

    grow(2)
    few = counts()
    grow(18)
    assert counts() == few


def test_a_parents_page_lists_its_children_with_their_status_failed_first(admin_client: Any) -> None:
    # It linked "5 child jobs" only: which child failed took a click and a search.
    from jobstate.admin import job_page
    from jobstate.models import Job

    parent = processing()
    children = [completed(parent=parent) for _ in range(3)]
    broken = failed(parent=parent)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[parent.pk])).content.decode()
    listed = html[html.index('class="js-children"') :]
    listed = listed[: listed.index("</ul>")]
    assert listed.count("<li>") == 4 and listed.count("js-badge-") == 4
    assert listed.index(f"/{broken.pk}/change/") < min(listed.index(f"/{c.pk}/change/") for c in children)
    link = f"{reverse('admin:jobstate_job_changelist')}?parent__id__exact={parent.pk}"
    assert f'>4 child jobs</a>: <a href="{link}&amp;status=failed">1 failed</a>' in html
    assert "3 completed</a>" in html
    # Capped: the first CHILDREN_SHOWN, and a link to them all.
    Job.objects.filter(pk__in=[c.pk for c in children]).delete()
    for _ in range(job_page.CHILDREN_SHOWN + 1):
        queued(parent=parent)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[parent.pk])).content.decode()
    listed = html[html.index('class="js-children"') :]
    listed = listed[: listed.index("</ul>")]
    assert listed.count("js-badge-") == job_page.CHILDREN_SHOWN and "all child jobs</a>" in listed
    assert "js-badge-failed" in listed  # still among those shown
    assert "22 child jobs</a>: <a" in html


def test_the_time_shows_the_last_run_and_the_whole_time_since_created(admin_client: Any) -> None:
    # A workflow that waited for its children ran 0.01s in its last run: "run time
    # 0.01s" hid the minute it took in all.
    from datetime import timedelta

    from jobstate.models import Job

    job = completed()
    created = job.finished_at - timedelta(minutes=2, seconds=3)
    Job.objects.filter(pk=job.pk).update(
        created_at=created, started_at=job.finished_at - timedelta(seconds=4)
    )
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert "last run 4.0s · 2m 03s from created to finished" in html
    running = processing()
    Job.objects.filter(pk=running.pk).update(created_at=running.started_at - timedelta(seconds=30))
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[running.pk])).content.decode()
    assert re.search(r"running (\d+ms|\d\.\ds) · 3\ds since created", html)


def test_a_finished_jobs_step_is_its_last_and_a_cancelled_one_never_ran_as_in_the_list(
    admin_client: Any,
) -> None:
    # A completed job showed "Current step: save" as if it were still in it, and a job
    # cancelled before it ran said "never started" here but "never ran" in the list.
    from jobstate.models import Job

    running = processing()
    services.report_progress(running, running.lease_token, 50, "half", step="save")
    page = reverse("admin:jobstate_job_change", args=[running.pk])
    html = admin_client.get(page).content.decode()
    assert re.search(r'field-step_display">.*?<div class="readonly">save</div>', html, re.S)
    services.complete(Job.objects.get(pk=running.pk), running.lease_token, {"ok": True})
    assert "save (the last one run)" in admin_client.get(page).content.decode()
    live = admin_client.get(reverse("admin:jobstate_job_live"), {"ids": str(running.pk)}).json()
    assert live["jobs"][str(running.pk)]["fields"]["step_display"] == "save (the last one run)"
    job = queued()
    services.request_cancel(job, None, "not needed")
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert "never ran" in html and "never started" not in html
    assert (
        "not started yet"
        in admin_client.get(reverse("admin:jobstate_job_change", args=[queued().pk])).content.decode()
    )


def test_the_live_refresh_sends_a_jobs_own_text_escaped(admin_client: Any, monkeypatch: Any) -> None:
    # live.js sets the fields and cells with innerHTML: a step of
    # '<img src=x onerror=...>' (a handler's report_progress) ran for staff watching.
    from jobstate.admin import live
    from jobstate.models import Job

    evil = '<img src=x onerror="alert(1)">'
    running = processing()
    services.report_progress(running, running.lease_token, 50, evil, step=evil)
    unserved = queued()
    for job in (running, unserved):
        Job.objects.filter(pk=job.pk).update(kind=evil, error_type=evil, error_message=evil)
    # A field whose display method returns the job's text as a plain str is escaped too.
    monkeypatch.setattr(live, "PAGE_FIELDS", (*live.PAGE_FIELDS, "kind_display"))
    ids = f"{running.pk},{unserved.pk}"
    data = admin_client.get(reverse("admin:jobstate_job_live"), {"ids": ids, "dashboard": "1"}).json()
    assert set(data["jobs"]) == {str(running.pk), str(unserved.pk)}
    sent = [
        html for job in data["jobs"].values() for html in (*job["cells"].values(), *job["fields"].values())
    ]
    sent += data["dashboard"]["html"].values()
    assert not [html for html in sent if "<img" in html]
    mine = data["jobs"][str(running.pk)]
    assert "&lt;img src=x" in mine["fields"]["step_display"] and "&lt;img" in mine["fields"]["kind_display"]
    assert (mine["progress_message"], mine["current_step"]) == (evil, evil)  # text, not HTML


def test_a_large_fan_out_lists_its_failed_child_first_and_counts_each_status(
    admin_client: Any, monkeypatch: Any
) -> None:
    # Past the read cap the rows were an unordered slice, sorted after the read: the
    # failed child was usually not among them, and no count by status was shown.
    from jobstate.admin import job_page

    monkeypatch.setattr(job_page, "CHILDREN_SHOWN", 2)
    parent = processing()
    for _ in range(5):
        completed(parent=parent)
    broken = failed(parent=parent)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[parent.pk])).content.decode()
    listed = html[html.index('class="js-children"') :]
    listed = listed[: listed.index("</ul>")]
    assert listed.index(f"/{broken.pk}/change/") < listed.index("js-badge-completed")
    assert listed.count("js-badge-") == 2 and "all child jobs</a>" in listed
    link = f"{reverse('admin:jobstate_job_changelist')}?parent__id__exact={parent.pk}"
    assert (
        f'>6 child jobs</a>: <a href="{link}&amp;status=failed">1 failed</a>'
        f' · <a href="{link}&amp;status=completed">5 completed</a>'
    ) in html


def test_a_job_queued_for_a_retry_or_waiting_for_its_children_is_not_said_to_be_running(
    admin_client: Any,
) -> None:
    # Both have started_at and no finished_at: they said "running 0.02s · 40s since created".
    from datetime import timedelta

    from jobstate.models import Job

    job = processing()
    services.fail(job, job.lease_token, "flaky", error_type="OSError")
    job = Job.objects.get(pk=job.pk)
    assert job.status == "queued" and job.started_at is not None and job.finished_at is None
    Job.objects.filter(pk=job.pk).update(
        created_at=job.started_at - timedelta(seconds=40), started_at=job.started_at - timedelta(seconds=30)
    )
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert re.search(r"last run began 3\ds ago · 4\ds since created", html)
    assert not re.search(r"running [\d.]+s", html)
    Job.objects.filter(pk=job.pk).update(status="waiting")
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert "last run began 3" in html and not re.search(r"running [\d.]+s", html)
    live = admin_client.get(reverse("admin:jobstate_job_live"), {"ids": str(job.pk)}).json()
    assert live["jobs"][str(job.pk)]["fields"]["duration_display"].startswith("last run began 3")


def test_the_pages_history_button_opens_the_jobs_transitions(admin_client: Any) -> None:
    # It was Django's change history, "This object doesn't have a change history":
    # the admin changes no job, only the services do, and they write the transitions.
    job = failed()
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    tools = html[html.index('class="object-tools"') :]
    tools = tools[: tools.index("</ul>")]
    history = f"{reverse('admin:jobstate_jobevent_changelist')}?job={job.pk}"
    assert f'<a href="{history}" class="historylink">Transition history</a>' in tools
    assert reverse("admin:jobstate_job_history", args=[job.pk]) not in html
    assert str(job.pk)[-8:] in admin_client.get(history).content.decode()


def test_the_pages_heading_and_breadcrumb_name_the_job_without_its_status(admin_client: Any) -> None:
    # They read str(job), "<kind> <id> [processing]", which the live refresh left as it
    # was once the badge said Completed.
    job = processing()
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    name = f"{job.kind} {job.pk}"
    assert f"<title>{name} | " in html and f"<h2>{name}</h2>" in html
    assert breadcrumbs(html)[-1] == name
    assert "[processing]" not in html


def test_a_job_that_failed_in_a_step_names_it_the_last_one_run(admin_client: Any) -> None:
    # "validate (the last one)" read as the job's final step, of a workflow failed in
    # step 3 of 4.
    from jobstate.models import Job

    job = processing()
    services.report_progress(job, job.lease_token, 60, "checking", step="validate")
    services.fail(Job.objects.get(pk=job.pk), job.lease_token, "bad row", retry=False)
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[job.pk])).content.decode()
    assert re.search(
        r'field-step_display">.*?<div class="readonly">validate \(the last one run\)</div>', html, re.S
    )
