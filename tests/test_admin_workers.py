"""The admin's workers panel and worker-process list, the app-list entries
(dashboard, stuck jobs) and the live-refresh endpoint."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin import AdminSite
from django.test import override_settings
from django.urls import path, reverse
from django.utils import timezone

import jobstate
from jobstate import services, stuck
from jobstate.admin import JobAdmin, live, stats
from jobstate.ids import short
from jobstate.models import Job, WorkerProcess
from jobstate.services import workers
from jobstate.states import Status
from tests.admin_support import breadcrumbs, grant, processing, queued

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:jobstate_job_dashboard")
LIVE = reverse("admin:jobstate_job_live")
PROCESSES = reverse("admin:jobstate_workerprocess_changelist")


def idle_cluster(cluster: str = "web-1:400", n: int = 2, now: Any = None) -> None:
    """A pusher and ``n`` worker processes beating with no job: an idle cluster."""
    workers.beat(f"{cluster}:{400}", cluster=cluster, role="pusher", now=now)
    for i in range(n):
        workers.beat(f"{cluster}:{401 + i}", cluster=cluster, role="worker", now=now)


def test_idle_cluster_is_alive_not_zero(admin_client: Any) -> None:
    idle_cluster()
    response = admin_client.get(DASHBOARD)
    found = response.context["workers"]
    assert (found.alive, found.busy, found.clusters_alive) == (2, 0, 1)
    html = response.content.decode()
    assert html.count('data-state="idle"') == 2 and 'data-state="alive"' in html  # the pusher
    tile = re.search(r'id="js-tile-workers".*?data-live-count="workers">(\d+)<', html, re.S)
    assert tile is not None and tile.group(1) == "2"
    assert "No worker process" not in html


def test_busy_dead_and_forgotten_processes() -> None:
    now = timezone.now()
    job = processing(worker="web-1:400:401")
    services.report_progress(job, job.lease_token, 40)
    workers.beat("web-1:400:401", cluster="web-1:400", role="worker", job_id=job.pk, now=now)
    workers.beat("web-1:400:402", cluster="web-1:400", role="worker", now=now)
    # A cluster that stopped beating ten minutes ago, and one gone for two hours.
    idle_cluster("web-2:500", n=1, now=now - timedelta(minutes=10))
    idle_cluster("web-3:600", n=1, now=now - timedelta(hours=2))
    found = stats.workers(now)
    assert [c.name for c in found.clusters] == ["web-1:400", "web-2:500"]
    live, dead = found.clusters
    assert [(p.pid, p.state, p.job_kind, p.job_progress) for p in live.processes] == [
        (401, "busy", job.kind, 40),
        (402, "idle", "", None),
    ]
    assert not dead.alive and {p.state for p in dead.processes} == {"dead"}
    assert (found.alive, found.busy, found.dead) == (2, 1, 2)


def test_panel_links_the_running_job(admin_client: Any) -> None:
    job = processing()
    workers.beat("h:1:2", cluster="h:1", role="worker", job_id=job.pk)
    html = admin_client.get(DASHBOARD).content.decode()
    panel = html[html.index('id="js-panel-workers"') :]
    assert reverse("admin:jobstate_job_change", args=[job.pk]) in panel
    assert 'data-state="busy"' in panel


def test_no_process_at_all_says_so(admin_client: Any) -> None:
    html = admin_client.get(DASHBOARD).content.decode()
    assert 'id="js-no-workers"' in html


def test_more_processes_than_the_panel_shows_are_still_counted(
    admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past PROCESS_ROWS the panel lists some rows only; its figures (and the tile's)
    # counted the rows listed, and dead rows of a cluster named earlier pushed live
    # ones out: five processes killed in the last hour made this tile read 0.
    monkeypatch.setattr(stats, "PROCESS_ROWS", 4)
    now = timezone.now()
    for pid in range(5):  # killed ten minutes ago (a hard limit, OOM): dead rows
        workers.beat(f"a-old:1:{pid}", cluster="a-old:1", role="worker", now=now - timedelta(minutes=10))
    job = processing()
    workers.beat("z-new:2:1", cluster="z-new:2", role="worker", job_id=job.pk, now=now)
    idle_cluster("z-new:3", n=2, now=now)
    found = stats.workers(now)
    assert found.truncated
    assert (found.alive, found.busy, found.clusters_alive) == (3, 1, 2)
    assert [c.name for c in found.clusters] == ["z-new:2", "z-new:3"]  # live rows first
    board = admin_client.get(f"{LIVE}?dashboard=1").json()["dashboard"]
    assert (board["counts"]["workers"], board["counts"]["busy"]) == (3, 1)
    monkeypatch.setattr(stats, "PROCESS_ROWS", 2)  # fewer rows shown than processes alive
    found = stats.workers(now)
    assert found.truncated and sum(len(c.processes) for c in found.clusters) == 2
    assert (found.alive, found.busy, found.clusters_alive) == (3, 1, 2)


def test_worker_process_list_is_read_only_for_job_viewers(client: Any, viewer: Any) -> None:
    idle_cluster()
    client.force_login(viewer)
    response = client.get(PROCESSES)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("js-state-idle") == 2 and "web-1:400:401" in html
    row = WorkerProcess.objects.get(name="web-1:400:401")
    change = reverse("admin:jobstate_workerprocess_change", args=[row.pk])
    assert client.get(change).status_code == 200  # a view, not a form
    assert client.post(change, {"pid": 1}).status_code == 403
    assert client.get(reverse("admin:jobstate_workerprocess_add")).status_code == 403
    assert client.get(reverse("admin:jobstate_workerprocess_delete", args=[row.pk])).status_code == 403


def test_the_process_pages_show_times_as_the_job_pages_do(admin_client: Any) -> None:
    # They showed Django's "Nov. 30, 2026, 1:26 p.m.", the job pages 2026-11-30 13:26:32.757.
    from jobstate.admin import display

    idle_cluster()
    row = WorkerProcess.objects.get(name="web-1:400:401")
    html = admin_client.get(PROCESSES).content.decode()
    assert "a.m." not in html and "p.m." not in html
    assert str(display.compact_time(row.started_at)) in html
    page = admin_client.get(reverse("admin:jobstate_workerprocess_change", args=[row.pk])).content.decode()
    assert "a.m." not in page and "p.m." not in page
    for moment in (row.started_at, row.seen_at):
        assert display.exact_time(moment) in page
    labels = re.findall(r"<label>([^<]*):</label>", page)
    assert labels.index("Started at") < labels.index("Seen at") < labels.index("Job id"), labels


def test_view_workerprocess_alone_shows_the_processes_but_not_their_jobs(
    client: Any, viewer: Any, django_user_model: Any
) -> None:
    # A process row is infrastructure, open to its own view permission; the job it runs
    # is a job's, shown only to staff who may view jobs (as its history and files).
    job = processing()
    workers.beat("web-1:400:401", cluster="web-1:400", role="worker", job_id=job.pk)
    row = WorkerProcess.objects.get(name="web-1:400:401")
    change = reverse("admin:jobstate_workerprocess_change", args=[row.pk])
    job_page = reverse("admin:jobstate_job_change", args=[job.pk])
    ops = django_user_model.objects.create_user("sre", password="pw-sre-12345", is_staff=True)
    for who, sees_job in ((grant(ops, "view_workerprocess"), False), (viewer, True)):
        client.force_login(who)
        listed, page = client.get(PROCESSES), client.get(change)
        assert listed.status_code == page.status_code == 200
        html = listed.content.decode()
        assert "web-1:400:401" in html and "js-state-busy" in html
        assert (job_page in html, short(job.pk) in html) == (sees_job, sees_job)
        assert (str(job.pk) in page.content.decode()) is sees_job
        assert "web-1:400:401" in page.content.decode()


@override_settings(JOBSTATE={"HEARTBEAT_SECONDS": 10})  # flagged past 2.5 s
def test_the_process_list_shows_each_clock_offset_and_flags_those_past_the_limit(admin_client: Any) -> None:
    idle_cluster(n=3)
    workers.beat("web-1:400:401", cluster="web-1:400", role="worker", clock_offset=0.04)
    workers.beat("web-1:400:402", cluster="web-1:400", role="worker", clock_offset=-3.1)
    html = admin_client.get(PROCESSES).content.decode()
    cells = dict(
        re.findall(
            r'<a href="[^"]*">(web-1:400:\d+)</a>.*?<td class="field-clock_col">(.*?)</td>', html, re.S
        )
    )
    assert cells["web-1:400:400"] == "—" and cells["web-1:400:403"] == "—"  # not measured (SQLite)
    assert cells["web-1:400:401"] == "+0.04 s"
    flagged = cells["web-1:400:402"]
    assert (
        "js-badge-failed" in flagged
        and "-3.10 s" in flagged
        and "behind the database&#x27;s clock" in flagged
    )


def test_staff_who_may_view_jobs_by_change_job_see_the_process_list_too(
    client: Any, django_user_model: Any
) -> None:
    # change_job lets staff view every job (models.job.may_view_all), as the dashboard's
    # workers panel they see links here: the list answered them 403.
    idle_cluster()
    editor = grant(
        django_user_model.objects.create_user("ed", password="pw-ed-12345", is_staff=True), "change_job"
    )
    client.force_login(editor)
    assert client.get(DASHBOARD).status_code == 200
    response = client.get(PROCESSES)
    assert response.status_code == 200 and "web-1:400:401" in response.content.decode()
    client.force_login(django_user_model.objects.create_user("st", password="pw-st-12345", is_staff=True))
    assert client.get(PROCESSES).status_code == 403


# --- the app list: dashboard and stuck jobs inside the Jobstate box ----------------


def jobstate_box(html: str) -> str:
    match = re.search(r'<div class="app-jobstate module[^"]*">(.*?)</div>', html, re.S)
    assert match is not None, "no Background jobs box"
    return match.group(1)


@pytest.mark.parametrize("first", ["jobstate", "django.contrib.admin"])
def test_index_box_lists_the_pages_whatever_the_app_order(
    admin_client: Any, settings: Any, first: str
) -> None:
    apps = [a for a in settings.INSTALLED_APPS if a != first]
    settings.INSTALLED_APPS = [first, *apps]
    html = admin_client.get(reverse("admin:index")).content.decode()
    box = jobstate_box(html)
    for url in (DASHBOARD, reverse("admin:jobstate_job_stuck"), reverse("admin:jobstate_job_changelist")):
        assert f'href="{url}"' in box
    assert f'href="{DASHBOARD}"' not in html.replace(box, "")  # only in the box
    assert 'id="content-related"' in html  # the sidebar keeps its own content
    # The dashboard and stuck pages come first, then the models.
    names = re.findall(r'<th scope="row"[^>]*>\s*<a [^>]*>([^<]+)</a>', box)
    assert names[:2] == ["Dashboard", "Stuck jobs"] and "Jobs" in names and "Worker processes" in names


def test_app_page_and_sidebar_list_the_pages(admin_client: Any) -> None:
    html = admin_client.get(reverse("admin:app_list", args=["jobstate"])).content.decode()
    assert f'href="{DASHBOARD}"' in jobstate_box(html)
    html = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    sidebar = html[html.index('id="nav-sidebar"') :]
    assert f'href="{DASHBOARD}"' in sidebar


def test_breadcrumbs_name_the_app_apart_from_its_job_model(admin_client: Any) -> None:
    """The app's name is not its Job model's plural (it made breadcrumbs read "Jobs > Jobs")."""
    job = queued()
    pages = {
        reverse("admin:jobstate_job_changelist"): ["Home", "Background jobs", "Jobs"],
        reverse("admin:jobstate_job_change", args=[job.pk]): [
            "Home",
            "Background jobs",
            "Jobs",
            f"{job.kind} {job.pk}",
        ],
        DASHBOARD: ["Home", "Background jobs", "Dashboard"],
        reverse("admin:jobstate_job_stuck"): ["Home", "Background jobs", "Jobs", "Stuck jobs"],
        PROCESSES: ["Home", "Background jobs", "Worker processes"],
    }
    for url, expected in pages.items():
        assert breadcrumbs(admin_client.get(url).content.decode()) == expected, url
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert re.search(r"<caption>\s*<a [^>]*>Background jobs</a>", html)


def test_no_job_permission_no_pages(client: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("ann", password="pw-ann-12345", is_staff=True)
    client.force_login(grant(user, "view_asset"))
    html = client.get(reverse("admin:index")).content.decode()
    assert DASHBOARD not in html
    assert client.get(DASHBOARD).status_code == 403


# --- the live endpoint ---------------------------------------------------------


def test_live_returns_status_progress_and_cells(admin_client: Any) -> None:
    job = processing()
    services.report_progress(job, job.lease_token, 37, "page 3 of 8", step="page-3")
    waiting = queued()
    response = admin_client.get(f"{LIVE}?ids={job.pk},{waiting.pk},not-a-uuid,{'0' * 32}")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    data = response.json()
    assert data["active"] == 2 and set(data["jobs"]) == {str(job.pk), str(waiting.pk)}
    mine = data["jobs"][str(job.pk)]
    assert (mine["status"], mine["progress"], mine["progress_message"], mine["current_step"]) == (
        Status.PROCESSING,
        37,
        "page 3 of 8",
        "page-3",
    )
    assert 'aria-valuenow="37"' in mine["cells"]["progress_col"] and "page-3" in mine["cells"]["progress_col"]
    assert 'aria-valuenow="37"' in mine["fields"]["progress_display"]
    assert "js-badge-processing" in mine["fields"]["status_display"]
    services.complete(job, job.lease_token, {})
    data = admin_client.get(f"{LIVE}?ids={job.pk}").json()
    assert data["active"] == 0 and data["jobs"][str(job.pk)]["status"] == Status.COMPLETED


def test_live_queries_do_not_grow_with_jobs(admin_client: Any, django_assert_max_num_queries: Any) -> None:
    few = [processing() for _ in range(2)]
    admin_client.get(f"{LIVE}?ids={few[0].pk}")  # warm the session and caches
    with django_assert_max_num_queries(12) as small:
        admin_client.get(f"{LIVE}?ids={','.join(str(j.pk) for j in few)}")
    many = few + [processing() for _ in range(20)] + [queued() for _ in range(10)]
    with django_assert_max_num_queries(len(small.captured_queries)) as large:
        data = admin_client.get(f"{LIVE}?ids={','.join(str(j.pk) for j in many)}").json()
    assert data["active"] == 32 and len(large.captured_queries) == len(small.captured_queries)


@pytest.mark.parametrize(
    ("mode", "computed"),
    [
        ("list", live.LIST_CELLS),
        ("job", live.PAGE_FIELDS),
        ("dashboard", ()),
        ("", live.LIST_CELLS + live.PAGE_FIELDS),  # a page loaded before mode was sent
    ],
)
def test_live_computes_only_what_the_asking_page_sets(
    admin_client: Any, monkeypatch: Any, mode: str, computed: tuple[str, ...]
) -> None:
    # Polled every second by every open list and job page: each job got the list's
    # cells and the page's fields, and a stuck-detection context (PostgreSQL's clock)
    # that only the list's status cell uses.
    job = processing()
    called: list[str] = []
    for name in (*live.LIST_CELLS, *live.PAGE_FIELDS):
        method = getattr(JobAdmin, name)
        monkeypatch.setattr(
            JobAdmin, name, lambda self, obj, _n=name, _m=method: called.append(_n) or _m(self, obj)
        )
    contexts: list[Any] = []
    real = stuck.Context
    monkeypatch.setattr(stuck, "Context", lambda *a, **kw: contexts.append(1) or real(*a, **kw))
    data = admin_client.get(LIVE, {"ids": str(job.pk), "mode": mode}).json()
    shown = data["jobs"][str(job.pk)]
    assert sorted(called) == sorted(computed)
    assert {*shown["cells"], *shown["fields"]} == set(computed)
    assert len(contexts) == (mode in ("list", ""))


def test_live_refuses_a_mode_it_does_not_know(admin_client: Any) -> None:
    response = admin_client.get(LIVE, {"ids": str(queued().pk), "mode": "page"})
    assert response.status_code == 400 and "list, job, dashboard" in response.json()["error"]


def test_live_script_says_which_page_asks() -> None:
    script = (Path(jobstate.__file__).parent / "static" / "jobstate" / "live.js").read_text()
    assert '"mode=" + encodeURIComponent(mode)' in script


def test_live_dashboard_counts_and_panel(admin_client: Any) -> None:
    queued()
    idle_cluster()
    data = admin_client.get(f"{LIVE}?dashboard=1").json()
    board = data["dashboard"]
    assert board["counts"] == {"queued": 1, "processing": 0, "workers": 2, "busy": 0}
    assert board["html"]["js-workers"].count('data-state="idle"') == 2
    assert data["active"] == 1


def test_live_is_checked_like_the_pages(client: Any, staff_user: Any, viewer: Any) -> None:
    job = queued()
    assert client.get(f"{LIVE}?ids={job.pk}").status_code == 302  # to the login page
    client.force_login(staff_user)  # staff, but may not view jobs
    assert client.get(f"{LIVE}?ids={job.pk}").status_code == 403
    client.force_login(viewer)
    assert client.get(f"{LIVE}?ids={job.pk}").json()["active"] == 1


def test_pages_load_the_live_script_with_what_to_follow(admin_client: Any) -> None:
    active = processing()
    html = admin_client.get(reverse("admin:jobstate_job_change", args=[active.pk])).content.decode()
    assert 'id="js-live"' in html and 'data-mode="job"' in html and 'data-active="1"' in html
    assert f'data-url="{LIVE}"' in html
    html = admin_client.get(reverse("admin:jobstate_job_changelist")).content.decode()
    assert 'data-mode="list"' in html and f'data-job="{active.pk}" data-active="1"' in html
    html = admin_client.get(DASHBOARD).content.decode()
    assert 'data-mode="dashboard"' in html and 'data-active="1"' in html


# A project's own AdminSite gets the entries too (JobAdmin installs them on its site).
ops_site = AdminSite(name="ops")
ops_site.register(Job, JobAdmin)
urlpatterns = [path("ops/", ops_site.urls)]


@override_settings(ROOT_URLCONF=__name__)
def test_a_custom_admin_site_lists_the_pages(admin_client: Any) -> None:
    html = admin_client.get("/ops/").content.decode()
    box = jobstate_box(html)
    assert 'href="/ops/jobstate/job/dashboard/"' in box and 'href="/ops/jobstate/job/stuck/"' in box
    assert admin_client.get("/ops/jobstate/job/dashboard/").status_code == 200
