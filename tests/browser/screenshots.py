"""Screenshots of the admin for the README (not part of the normal test run).

Run explicitly, under the demo's settings (so the kind filter lists no test-only
kinds); it rewrites docs/screenshots/*.png:

    .venv/bin/pytest --ds=project.settings tests/browser/screenshots.py

It fills the database with a realistic mix of jobs through jobstate.services
(time travel by ``now=`` arguments and a few timestamp updates for history), then
photographs the job list, one job page, the stuck page, the dashboard and the
admin index.
"""

from __future__ import annotations

import os
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from jobstate import services
from jobstate.models import Job, JobEvent, JobStep
from jobstate.services import workers
from jobstate.worker import schedules
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OUT = Path(
    os.environ.get("JOBSTATE_SCREENSHOTS_DIR") or Path(__file__).resolve().parents[2] / "docs" / "screenshots"
)
KINDS = {"reports.build": 300, "images.thumbnail": 60, "billing.sync": 120, "emails.send": 30}


def seed(users: list[Any], temp_handler: Any) -> Job:
    rng = random.Random(7)
    for kind, timeout in KINDS.items():
        temp_handler(kind, timeout=timeout, max_attempts=3)
    temp_handler("legacy.export", timeout=60)
    schedules.install()  # as a deployed project has them: the dashboard warns without
    now = timezone.now()
    # A day of finished work, denser in the last hour, for the charts.
    for i in range(240):
        kind = rng.choice(list(KINDS))
        start = now - timedelta(minutes=rng.random() ** 1.6 * 24 * 60)
        job = services.enqueue(
            kind, {"batch": i}, owner=rng.choice(users), run_after=start - timedelta(seconds=2)
        )
        services.start(job, f"web-{rng.randint(1, 3)}", now=start)
        length = rng.lognormvariate(2.2 if kind != "reports.build" else 3.4, 0.6)
        end = start + timedelta(seconds=length)
        if rng.random() < 0.04:
            job.max_attempts = 1
            Job.objects.filter(pk=job.pk).update(max_attempts=job.attempts)
            services.fail(job, job.lease_token, "upstream returned 503", error_type="HTTPError", now=end)
        elif rng.random() < 0.04:
            services.mark_partial(job, job.lease_token, {"rows": 812}, "3 invoices skipped", now=end)
        else:
            services.complete(job, job.lease_token, {"rows": rng.randint(10, 5000)}, now=end)
        Job.objects.filter(pk=job.pk).update(created_at=start - timedelta(seconds=2))
    # Work in progress.
    running: list[Job] = []
    for i in range(9):
        job = services.enqueue(
            rng.choice(list(KINDS)),
            {"page": i},
            owner=rng.choice(users),
            run_after=now - timedelta(minutes=2),
        )
        job = services.start(
            job, f"web-{i % 3 + 1}", lease_seconds=3600, now=now - timedelta(seconds=40 + i * 9)
        )
        services.heartbeat(job, job.lease_token, lease_seconds=600)
        services.report_progress(
            job, job.lease_token, rng.randint(5, 95), f"page {i + 1} of 12", step=f"page-{i + 1}"
        )
        running.append(job)
    # Two clusters beating, one busy with some of those jobs, one idle; a third died.
    for cluster, size, started in (
        ("web-1:4120", 4, timedelta(hours=3)),
        ("web-2:3310", 2, timedelta(minutes=50)),
    ):
        pid = cluster.partition(":")[2]
        workers.beat(f"{cluster}:{pid}", cluster=cluster, role="pusher", now=now - started)
        workers.beat(f"{cluster}:{pid}", cluster=cluster, role="pusher")
        for n in range(size):
            busy = running[n] if cluster.startswith("web-1") and n < 3 else None
            name = f"{cluster}:{int(pid) + 1 + n}"
            workers.beat(name, cluster=cluster, role="worker", now=now - started)
            workers.beat(name, cluster=cluster, role="worker", job_id=busy and busy.pk, finished=12 + 7 * n)
    workers.beat("web-3:2900:2901", cluster="web-3:2900", role="worker", now=now - timedelta(minutes=12))
    for i in range(6):
        services.enqueue(
            rng.choice(list(KINDS)), {"n": i}, owner=rng.choice(users), priority=rng.choice([0, 0, 5])
        )
    services.enqueue("reports.build", {"month": "2026-12"}, run_after=now + timedelta(hours=3))
    # Things that need a person.
    for i in range(2):
        job = services.enqueue("billing.sync", {"account": 1000 + i}, run_after=now - timedelta(hours=1))
        services.start(job, "web-4", lease_seconds=60, now=now - timedelta(minutes=25 + i))
    hung = services.enqueue(
        "images.thumbnail", {"image": 77}, owner=users[1], run_after=now - timedelta(hours=1)
    )
    hung = services.start(hung, "web-2", lease_seconds=3600, now=now - timedelta(minutes=9))
    services.request_cancel(hung, services.Actor.admin(users[0]), "wrong image set")
    Job.objects.filter(pk=hung.pk).update(cancel_requested_at=now - timedelta(minutes=6))
    services.enqueue("legacy.export", {"table": "orders"}, run_after=now - timedelta(minutes=40))
    # The job shown on its own page: a report with a failed first attempt, steps, assets.
    job = services.enqueue(
        "reports.build",
        {"report": "revenue", "month": "2026-10", "regions": ["eu", "us", "apac"], "format": "csv"},
        owner=users[0],
        key="revenue-2026-10",
        run_after=now - timedelta(minutes=6),
    )
    Job.objects.filter(pk=job.pk).update(created_at=now - timedelta(minutes=6))
    JobEvent.objects.filter(job=job).update(created_at=now - timedelta(minutes=6))
    job = services.start(job, "web-1", now=now - timedelta(minutes=5, seconds=50))
    services.fail(
        job,
        job.lease_token,
        "connection reset by peer",
        error_type="ConnectionError",
        traceback='Traceback (most recent call last):\n  File "reports.py", line 88, in fetch\n'
        "ConnectionError: connection reset by peer",
        retry_delay=30,
        now=now - timedelta(minutes=5),
    )
    job = services.start(job, "web-3", lease_seconds=600, now=now - timedelta(minutes=4, seconds=20))
    for pos, (name, status) in enumerate(
        [("fetch", "completed"), ("aggregate", "completed"), ("render", "running"), ("publish", "pending")],
        start=1,
    ):
        JobStep.objects.create(
            job=job,
            position=pos,
            name=name,
            status=status,
            attempts=1 if status != "pending" else 0,
            cursor={"region": "apac", "offset": 4200} if status == "running" else None,
            output={"rows": 18234} if status == "completed" else None,
            started_at=now - timedelta(minutes=5 - pos) if status != "pending" else None,
            finished_at=now - timedelta(minutes=4.5 - pos) if status == "completed" else None,
        )
    services.add_asset(
        job,
        asset_type="report",
        name="revenue-2026-10-eu.csv",
        content=b"region,revenue\n" + b"eu,1000\n" * 900,
        token=job.lease_token,
    )
    services.add_asset(
        job,
        asset_type="report",
        name="revenue-2026-10-us.csv",
        content=b"region,revenue\n" + b"us,1000\n" * 1400,
        token=job.lease_token,
    )
    services.heartbeat(job, job.lease_token, lease_seconds=600)
    services.report_progress(job, job.lease_token, 64, "rendering region apac (3 of 4 steps)", step="render")
    # Jobs made "in the past" above were still created now: date them back too.
    Job.objects.filter(run_after__lt=F("created_at")).update(created_at=F("run_after"))
    return job


def test_screenshots(
    page: Any,
    live_server: Any,
    admin_user: Any,
    django_user_model: Any,
    temp_handler: Any,
    settings: Any,
    tmp_path: Any,
) -> None:
    settings.MEDIA_ROOT = tmp_path
    users = [django_user_model.objects.create_user(n, password="pw-123456") for n in ("alice", "bob", "chen")]
    job = seed([*users, None], temp_handler)
    OUT.mkdir(parents=True, exist_ok=True)
    base = live_server.url
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    log_in(page, base, "admin", "password", "/admin/jobstate/job/")
    page.set_viewport_size({"width": 1400, "height": 1300})
    page.goto(f"{base}/admin/jobstate/job/?status=active")
    page.screenshot(path=str(OUT / "job-list.png"), full_page=False)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{base}/admin/jobstate/job/{job.pk}/change/")
    page.screenshot(path=str(OUT / "job-page.png"), full_page=True)
    page.goto(f"{base}/admin/jobstate/job/stuck/")
    page.screenshot(path=str(OUT / "stuck.png"), full_page=True)
    page.goto(f"{base}/admin/jobstate/job/dashboard/")
    page.screenshot(path=str(OUT / "dashboard.png"), full_page=True)
    page.goto(f"{base}/admin/")
    page.screenshot(path=str(OUT / "admin-index.png"), full_page=False)
