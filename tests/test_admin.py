"""The job admin through Django's test client: list, job page, operations,
permissions, bulk actions."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import django
import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobstate import services
from jobstate.admin import display
from jobstate.ids import short
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.testing import drain
from jobstate.worker import retention_holds
from tests.admin_support import completed, expired, failed, grant, processing, queued

pytestmark = pytest.mark.django_db

LIST = reverse("admin:jobstate_job_changelist")


def change_url(job: Job) -> str:
    return reverse("admin:jobstate_job_change", args=[job.pk])


def act_url(job: Job, name: str) -> str:
    return reverse("admin:jobstate_job_transition", args=[job.pk, name])


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def html_of(client: Any, url: str) -> str:
    return client.get(url).content.decode()


def last_event(job: Job) -> JobEvent:
    return JobEvent.objects.filter(job=job).order_by("-created_at", "-id").first()  # type: ignore[return-value]


# --- the list -------------------------------------------------------------------


def test_list_shows_badges_progress_attempts_and_owner(admin_client: Any, user: Any) -> None:
    job = processing(user, max_attempts=5)
    services.report_progress(job, job.lease_token, 42, "half way", step="load")
    done = completed(None)
    response = admin_client.get(LIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="js-badge js-badge-processing"' in html
    assert 'class="js-badge js-badge-completed"' in html
    assert 'aria-valuenow="42"' in html
    assert "1/5" in html  # attempts
    assert '<span class="js-step">load</span>' in html  # current step
    assert 'title="half way"' in html  # the progress message, on hover
    assert "alice" in html
    assert short(done.pk) in html
    assert "running " in html and "took " in html


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0ms"),
        (0.003, "3ms"),
        (0.3, "0.3s"),
        (1, "1.0s"),
        (7.23, "7.2s"),
        (9.96, "10s"),
        (41.7, "41s"),
        (185, "3m 05s"),
        (7500, "2h 05m"),
    ],
)
def test_one_duration_format_on_every_admin_page(seconds: float, shown: str) -> None:
    # The job list read "waiting 7.23s", "took 0.30s", "took 0s" and "took 1s" side by side,
    # the deliveries "3 ms".
    from jobstate.admin import display

    assert display.short_duration(timedelta(seconds=seconds)) == shown


def test_the_job_list_shows_its_durations_to_a_tenth_of_a_second(admin_client: Any, user: Any) -> None:
    job = processing(user, started=timezone.now() - timedelta(seconds=0.3))
    services.complete(job, job.lease_token, {}, now=job.started_at + timedelta(seconds=0.3))
    cells = re.findall(r'<td class="field-age_col">(.*?)</td>', admin_client.get(LIST).content.decode())
    assert cells == ["took 0.3s"]


def test_list_queries_do_not_grow_with_rows(admin_client: Any, user: Any) -> None:
    for _ in range(3):
        queued(user)
    processing(user)
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(LIST).status_code == 200
    for _ in range(30):
        queued(user)
        completed(user)
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(LIST).status_code == 200
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
    assert len(many) <= 25
    # No unbounded COUNT(*) over the table: every count is capped by a LIMIT, but
    # the one pass over the processing jobs (a set bounded by the workers), which
    # counts the stuck reasons of jobs a worker holds.
    for q in many.captured_queries:
        sql = q["sql"].upper()
        if "COUNT(" in sql and "JOBSTATE_JOB" in sql:
            processing_only = sql.endswith("""WHERE "JOBSTATE_JOB"."STATUS" = 'PROCESSING' GROUP BY 1""")
            assert "LIMIT" in sql or processing_only, q["sql"]


@pytest.mark.parametrize(
    ("query", "expect", "refuse"),
    [
        ("status=failed", "failed", "queued"),
        ("status=active", "queued", "failed"),
        ("stuck=lease_expired", "expired", "queued"),
        ("stuck=any", "expired", "queued"),
        ("owner=none", "failed", "queued"),
        ("kind=test.limited", "limited", "queued"),
    ],
)
def test_list_filters(admin_client: Any, user: Any, query: str, expect: str, refuse: str) -> None:
    jobs = {
        "queued": queued(user),
        "failed": failed(None),
        "expired": expired(user),
        "limited": queued(user, kind="test.limited"),
    }
    response = admin_client.get(f"{LIST}?{query}")
    assert response.status_code == 200
    html = response.content.decode()
    assert short(jobs[expect].pk) in html
    assert short(jobs[refuse].pk) not in html


def test_owner_filter_lists_owners_and_me(
    admin_client: Any, admin_user: Any, user: Any, other_user: Any
) -> None:
    mine = queued(admin_user)
    alices = queued(user)
    queued(other_user)
    html = admin_client.get(LIST).content.decode()
    assert "?owner=me" in html and f"?owner={user.pk}" in html and f"?owner={other_user.pk}" in html
    html = admin_client.get(f"{LIST}?owner=me").content.decode()
    assert short(mine.pk) in html and short(alices.pk) not in html
    html = admin_client.get(f"{LIST}?owner={user.pk}").content.decode()
    assert short(alices.pk) in html and short(mine.pk) not in html


def test_kind_filter_offers_registered_and_stored_kinds(admin_client: Any) -> None:
    queued(kind="test.limited")
    html = admin_client.get(LIST).content.decode()
    assert "?kind=test.limited" in html  # stored
    assert "?kind=test.echo" in html  # registered, no job yet


def test_date_filters_and_hierarchy(admin_client: Any) -> None:
    job = queued()
    day = job.created_at
    html = admin_client.get(f"{LIST}?created_at__year={day.year}").content.decode()
    assert short(job.pk) in html
    assert f"created_at__month={day.month}" in html  # the month level offers this month
    html = admin_client.get(
        f"{LIST}?created_at__year={day.year}&created_at__month={day.month}"
    ).content.decode()
    assert f"created_at__day={day.day}" in html
    html = admin_client.get(f"{LIST}?created_at__year={day.year - 1}").content.decode()
    assert short(job.pk) not in html
    # The "created at" filter's own "Today" link.
    today = re.search(r'href="(\?created_at__gte=[^"]+)"[^>]*>Today<', html_of(admin_client, LIST))
    assert today is not None
    response = admin_client.get(LIST + today.group(1).replace("&amp;", "&"))
    assert response.status_code == 200 and short(job.pk) in response.content.decode()


def test_search_by_id_prefix_key_and_owner(admin_client: Any, user: Any) -> None:
    keyed = queued(key="invoice-42")
    owned = queued(user)
    other = queued()

    def found(term: str) -> set[str]:
        html = admin_client.get(LIST, {"q": term}).content.decode()
        return {str(j.pk) for j in (keyed, owned, other) if short(j.pk) in html}

    assert found(str(other.pk)) == {str(other.pk)}
    assert str(other.pk) in found(str(other.pk)[:13])  # a prefix of the id
    assert found(short(other.pk)) == {str(other.pk)}  # the short id the list shows
    assert found("invoice-42") == {str(keyed.pk)}
    assert found("ALICE") == {str(owned.pk)}
    assert found("nobody-by-that-name") == set()


def test_bulk_action_on_a_short_id_search_reads_the_ids_once(
    admin_client: Any, admin_user: Any, monkeypatch: Any
) -> None:
    from jobstate.admin import job_search

    target, other = queued(), queued()
    calls: list[str] = []
    real = job_search.short_id_matches

    def counted(queryset: Any, term: str) -> Any:
        calls.append(term)
        return real(queryset, term)

    monkeypatch.setattr(job_search, "short_id_matches", counted)
    data = {"action": "cancel_selected", "_selected_action": [str(target.pk)], "index": 0}
    data.update(confirm="yes", reason="wrong input")
    response = admin_client.post(f"{LIST}?q={short(target.pk)}", data)
    assert response.status_code == 302
    assert calls == [short(target.pk)]  # the changelist and the action share one scan
    assert Job.objects.get(pk=target.pk).status == Status.CANCELLED
    assert Job.objects.get(pk=other.pk).status == Status.QUEUED


BAD_FILTERS = (
    "status=nonsense",
    "stuck=nonsense",
    "owner=not-a-user",
    "created_at__year=abc",
    # The date hierarchy: a month or day without a year, impossible or unrepresentable dates.
    "created_at__month=5",
    "created_at__day=5",
    "created_at__month=5&created_at__day=5",
    "created_at__day=99",
    "created_at__month=abc",
    "created_at__year=2024&created_at__day=5",
    "created_at__year=2024&created_at__month=13",
    "created_at__year=2024&created_at__month=2&created_at__day=30",
    "created_at__year=0",
    "created_at__year=-1",
    "created_at__year=9999",
    "created_at__year=9999&created_at__month=12",
    "created_at__year=9999&created_at__month=12&created_at__day=31",
    "created_at__year=99999999999999999999",
    # NUL characters, which PostgreSQL refuses in text: every filter, the search, the keys.
    "kind=%00",
    "kind=test.echo%00",
    "status=%00",
    "stuck=%00",
    "owner=%00",
    "q=%00",
    "o=%00",
    "p=%00",
    "created_at__year=%00",
    "created_at__year=2024&created_at__month=%00",
    "created_at__gte=%00",
    "%00=1",
    "kind%00=x",
)


def test_bad_filter_values_do_not_500(admin_client: Any) -> None:
    queued()
    for query in BAD_FILTERS:
        response = admin_client.get(f"{LIST}?{query}")
        assert response.status_code in (200, 302), query
        if response.status_code == 302:  # Django's answer to invalid lookups: the unfiltered list
            assert response["Location"] == f"{LIST}?e=1", query
            page = admin_client.get(response["Location"])
            assert page.status_code == 200, query
            assert "The filters were not valid and have been cleared" in page.content.decode(), query
        else:
            assert 'id="changelist"' in response.content.decode(), query


# --- the job page -----------------------------------------------------------------


def test_job_page_shows_history_steps_assets_and_pretty_json(admin_client: Any, user: Any) -> None:
    job = processing(user, parameters={"n": 7, "label": "<b>x</b>"})
    services.add_asset(job, asset_type="report", name="out.csv", content=b"a,b\n1,2\n", token=job.lease_token)
    JobStep.objects.create(
        job=job,
        position=1,
        name="extract",
        status="completed",
        cursor={"page": 3},
        started_at=job.started_at,
        finished_at=job.started_at,
    )
    services.fail(
        job, job.lease_token, "timeout talking to S3", error_type="TimeoutError", traceback="TB line"
    )
    response = admin_client.get(change_url(job))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Transition history" in html and "Workflow steps" in html and "Assets" in html
    assert "worker:w-test" in html and "attempt 1 failed: timeout talking to S3" in html
    assert "&quot;label&quot;: &quot;&lt;b&gt;x&lt;/b&gt;&quot;" in html  # pretty-printed, escaped
    assert "out.csv" in html and "8\xa0bytes" in html
    assert reverse("admin:jobstate_asset_download", args=[job.assets.get().pk]) in html
    assert "extract" in html and "{&quot;page&quot;: 3}" in html
    assert "TB line" in html


def test_job_page_shows_a_step_in_progress_when_its_job_ended_as_interrupted(admin_client: Any) -> None:
    """As state(job) does; the page showed it Running in a cancelled job."""
    job = processing()
    JobStep.objects.create(job=job, position=0, name="load", status="running", started_at=job.started_at)
    assert ">Running<" in admin_client.get(change_url(job)).content.decode()
    services.request_cancel(job, reason="enough")
    services.cancel_now(job, job.lease_token)
    html = admin_client.get(change_url(job)).content.decode()
    assert "Interrupted (was running)" in html and ">Running<" not in html
    assert JobStep.objects.get(job=job).status == "running"  # read-side: nothing written


def test_job_page_is_read_only(admin_client: Any) -> None:
    job = queued()
    html = admin_client.get(change_url(job)).content.decode()
    assert 'name="_save"' not in html
    assert 'name="status"' not in html
    response = admin_client.post(change_url(job), {"status": "completed", "progress": 100})
    assert response.status_code == 403
    assert admin_client.get(reverse("admin:jobstate_job_add")).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_active_job_cannot_be_deleted_and_bulk_delete_is_gone(admin_client: Any) -> None:
    job = queued()
    assert admin_client.get(reverse("admin:jobstate_job_delete", args=[job.pk])).status_code == 403
    assert "delete_selected" not in admin_client.get(LIST).content.decode()
    done = completed()
    response = admin_client.post(reverse("admin:jobstate_job_delete", args=[done.pk]), {"post": "yes"})
    assert response.status_code == 302 and not Job.objects.filter(pk=done.pk).exists()


def test_a_finished_job_with_an_active_job_below_it_cannot_be_deleted(admin_client: Any) -> None:
    # Deleting a job deletes its children, and theirs: the page names each active one
    # the cascade would take as protected, and the POST deletes nothing.
    top = completed()
    middle = completed(parent=top)
    below = queued(parent=middle)
    done = completed(parent=middle)
    for job in (top, middle):
        url = reverse("admin:jobstate_job_delete", args=[job.pk])
        for response in (admin_client.get(url), admin_client.post(url, {"post": "yes"})):
            html = response.content.decode()
            assert response.status_code == 200, html
            assert "would require deleting the following protected related objects" in html
            assert f'<a href="{change_url(below)}">{below}</a>, still active' in html
            assert "permission" not in html and f"{done}</a>, still active" not in html
    assert Job.objects.filter(pk__in=[top.pk, middle.pk, below.pk, done.pk]).count() == 4


def _refused(client: Any, job: Job) -> str:
    """The delete page of ``job``, shown again on a confirmed POST, which deletes nothing."""
    url = reverse("admin:jobstate_job_delete", args=[job.pk])
    pages = [client.get(url), client.post(url, {"post": "yes"})]
    for response in pages:
        assert response.status_code == 200
        assert "would require deleting the following protected related objects" in response.content.decode()
    assert Job.objects.filter(pk=job.pk).exists()
    return str(pages[0].content.decode())


@pytest.mark.parametrize("chunk", [1000, 1])  # 1: a statement a job, the ancestors in the first
def test_a_finished_job_an_active_retry_holds_cannot_be_deleted(
    admin_client: Any, monkeypatch: Any, chunk: int
) -> None:
    # Retention keeps the jobs earlier in an active retry's chain, and every job below
    # them (retention_holds): deleted, one would empty the next one's retry_of (SET_NULL)
    # under the running chain. The page names the retry.
    monkeypatch.setattr(retention_holds, "CHUNK", chunk)

    def held(job: Job, retry: Job) -> str:
        by = f'<a href="{change_url(retry)}">{retry}</a>'
        return f'<a href="{change_url(job)}">{job}</a>, held by the active retry {by}'

    first = failed()
    second = services.request_cancel(services.retry(first), "ops")
    third = services.retry(second)  # queued: holds second and first
    for job in (first, second):
        assert held(job, third) in _refused(admin_client, job)
    parent = completed()
    child = completed(parent=parent)
    again = services.retry(parent)  # holds the parent and, below it, the child
    assert held(child, again) in _refused(admin_client, child)
    page = _refused(admin_client, parent)
    assert held(parent, again) in page and f"{child}</a>, held" not in page
    top = completed()
    below = failed(parent=top)
    retry = services.retry(below)  # a child of top too
    page = _refused(admin_client, top)
    assert held(below, retry) in page and f"{retry}</a>, still active" in page
    # Once the chain has ended, nothing holds its jobs.
    services.request_cancel(third, "ops")
    url = reverse("admin:jobstate_job_delete", args=[first.pk])
    assert "protected" not in admin_client.get(url).content.decode()
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk=first.pk).exists()


def test_a_finished_job_below_an_active_job_cannot_be_deleted(admin_client: Any) -> None:
    # Retention keeps a job with an active job above it (ActiveAbove): a retried child
    # workflow reuses its completed children. The page names the nearest active one.
    def below(job: Job, above: Job) -> str:
        by = f'<a href="{change_url(above)}">{above}</a>'
        return f'<a href="{change_url(job)}">{job}</a>, below the active job {by}'

    top = processing()
    middle = completed(parent=top)
    leaf = completed(parent=middle)
    assert below(leaf, top) in _refused(admin_client, leaf)
    page = _refused(admin_client, middle)
    assert below(middle, top) in page and f"{leaf}</a>, below" not in page
    outer = processing()
    inner = processing(parent=outer)
    done = completed(parent=inner)
    page = _refused(admin_client, done)
    assert below(done, inner) in page and f"{outer}</a>" not in page
    # Once the job above has finished, nothing keeps them.
    services.complete(top, top.lease_token, {"ok": True})
    url = reverse("admin:jobstate_job_delete", args=[middle.pk])
    assert "protected" not in admin_client.get(url).content.decode()
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk__in=[middle.pk, leaf.pk]).exists()


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (queued, {"cancel", "fail"}),
        (processing, {"cancel", "requeue", "fail"}),
        (completed, {"retry"}),
        (failed, {"retry"}),
    ],
)
def test_buttons_only_for_transitions_allowed_now(admin_client: Any, make: Any, shown: set[str]) -> None:
    job = make()
    html = admin_client.get(change_url(job)).content.decode()
    offered = set(re.findall(r"/act/([a-z_]+)/", html))
    assert offered == shown


def test_force_cancel_offered_once_cancel_requested(admin_client: Any) -> None:
    job = processing()
    services.request_cancel(job, "someone", "stop")
    offered = set(re.findall(r"/act/([a-z_]+)/", admin_client.get(change_url(job)).content.decode()))
    assert offered == {"force_cancel", "requeue", "fail"}


# --- operations ---------------------------------------------------------------


def test_cancel_asks_for_a_reason_then_goes_through_services(admin_client: Any, admin_user: Any) -> None:
    job = queued()
    page = admin_client.get(act_url(job, "cancel"))
    assert page.status_code == 200 and 'name="reason"' in page.content.decode()
    response = admin_client.post(act_url(job, "cancel"), {"reason": "   "})
    assert response.status_code == 200 and "Give a reason." in response.content.decode()
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    response = admin_client.post(act_url(job, "cancel"), {"reason": "customer asked"})
    assert response.status_code == 302 and response["Location"] == change_url(job)
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    event = last_event(job)
    assert (event.from_status, event.to_status, event.transition) == ("queued", "cancelled", "cancel")
    assert event.actor == admin_user and event.actor_label == "admin" and event.reason == "customer asked"
    assert "Job cancelled." in texts(response)


def test_ending_a_parent_says_what_it_does_to_its_unfinished_children(admin_client: Any) -> None:
    # The cascade cancelled them, yet the confirmation said nothing and the result was
    # "Job failed.".
    parent = processing()
    first, second = queued(parent=parent), queued(parent=parent)
    running, asked = processing(parent=parent), processing(parent=parent)
    completed(parent=parent)
    services.request_cancel(asked, "ops", "first")  # asked already: not counted again
    grandchild = queued(parent=first)  # goes with its parent, not counted
    note = "3 unfinished child jobs of this job will be cancelled too"
    assert note in admin_client.get(act_url(parent, "fail")).content.decode()
    response = admin_client.post(act_url(parent, "fail"), {"reason": "bad input"})
    assert "Job failed; 2 child jobs cancelled, 1 asked to stop." in texts(response)
    assert {Job.objects.get(pk=j.pk).status for j in (first, second, grandchild)} == {Status.CANCELLED}
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    lone = queued()
    assert "unfinished child" not in admin_client.get(act_url(lone, "fail")).content.decode()
    assert "Job failed." in texts(admin_client.post(act_url(lone, "fail"), {"reason": "x"}))
    other = processing()
    queued(parent=other)
    assert "1 unfinished child job of this job" in admin_client.get(act_url(other, "cancel")).content.decode()
    response = admin_client.post(act_url(other, "cancel"), {"reason": "stop"})
    assert (
        "Cancel requested: the worker stops the job at its next heartbeat or progress report; "
        "1 child job cancelled."
    ) in texts(response)


def test_cancel_processing_records_request(admin_client: Any, admin_user: Any) -> None:
    job = processing()
    response = admin_client.post(act_url(job, "cancel"), {"reason": "wrong input"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.cancel_requested_at is not None
    event = last_event(job)
    assert (
        event.transition == "request_cancel" and event.actor == admin_user and event.reason == "wrong input"
    )
    assert any("Cancel requested" in t for t in texts(response))


def test_retry_creates_linked_job_and_opens_it(admin_client: Any, admin_user: Any) -> None:
    job = failed()
    response = admin_client.post(act_url(job, "retry"), {"reason": "disk freed"})
    new = Job.objects.get(retry_of=job)
    assert response.status_code == 302 and response["Location"] == change_url(new)
    assert new.status == Status.QUEUED and Job.objects.get(pk=job.pk).status == Status.FAILED
    event = last_event(new)
    assert event.actor == admin_user and event.actor_label == "admin" and event.reason == "disk freed"


def test_retry_of_a_workflow_says_it_runs_from_its_first_step_and_offers_the_later_ones(
    admin_client: Any, admin_user: Any
) -> None:
    job = services.enqueue("wf.fixable", {})
    drain(kinds=["wf.fixable"])  # step two fails: one completed
    page = admin_client.get(act_url(job, "retry")).content.decode()
    assert "a retry runs it again from its first step, so the side effects of its completed steps" in page
    options = re.findall(r'<option value="([^"]*)"', page)
    assert options == ["", "two"]  # three comes after a step that did not complete
    plain = admin_client.get(act_url(failed(), "retry")).content.decode()
    assert "js-workflow-retry" not in plain and "from_step" not in plain

    refused = admin_client.post(act_url(job, "retry"), {"reason": "again", "from_step": "three"})
    assert refused.status_code == 200 and not Job.objects.filter(retry_of=job).exists()
    response = admin_client.post(act_url(job, "retry"), {"reason": "two fixed", "from_step": "two"})
    new = Job.objects.get(retry_of=job)
    assert response.status_code == 302 and response["Location"] == change_url(new)
    steps = dict(JobStep.objects.filter(job_id=new.pk).values_list("name", "status"))
    assert steps == {"one": "completed", "two": "pending", "three": "pending"}
    event = JobEvent.objects.get(job_id=new.pk, transition="retry_from")
    assert event.actor == admin_user and event.metadata["from_step"] == "two" and event.reason == "two fixed"


def test_requeue_and_fail(admin_client: Any, admin_user: Any) -> None:
    job = expired()
    admin_client.post(act_url(job, "requeue"), {"reason": "worker died"})
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.lease_token is None
    assert (last_event(job).actor, last_event(job).reason) == (admin_user, "worker died")
    other = queued()
    admin_client.post(act_url(other, "fail"), {"reason": "bad data, do not run"})
    other.refresh_from_db()
    assert other.status == Status.FAILED and other.error_message == "bad data, do not run"
    assert last_event(other).actor_label == "admin"


def test_requeue_of_a_running_job_says_the_next_attempt_waits_for_its_lease(admin_client: Any) -> None:
    job = processing(lease_seconds=600)
    page = html.unescape(html_of(admin_client, act_url(job, "requeue")))
    assert "the next attempt waits until the lease would have run out" in page
    response = admin_client.post(act_url(job, "requeue"), {"reason": "worker hung"})
    after = Job.objects.get(pk=job.pk)
    assert after.status == Status.QUEUED and after.run_after == job.lease_expires_at
    when = timezone.localtime(job.lease_expires_at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    assert texts(response) == [
        f"Job requeued: its next attempt starts after {when}, when its old lease would have run out."
    ]
    assert services.claim("w2") == []


def test_force_cancel_page_says_how_long_ago_the_cancel_was_requested(admin_client: Any) -> None:
    """In the admin's own durations, as the stuck page says it: Django's timesince said
    "cancel requested 0 minutes ago" for a cancel requested 40 seconds before."""
    job = processing()
    services.request_cancel(job, "someone", "stop")
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now() - timedelta(seconds=40))
    page = html_of(admin_client, act_url(job, "force_cancel"))
    assert re.search(r"cancel requested 4\ds ago", page), page
    assert "0\xa0minutes" not in page and "0 minutes" not in page


def test_force_cancel_honours_pending_cancel(admin_client: Any, admin_user: Any) -> None:
    job = processing()
    services.request_cancel(job, "someone", "stop")
    response = admin_client.post(act_url(job, "force_cancel"), {"reason": "worker hung"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    assert (last_event(job).actor, last_event(job).transition) == (admin_user, "cancel")


def test_refused_operation_shows_invalid_transition(admin_client: Any) -> None:
    job = completed()
    response = admin_client.post(act_url(job, "cancel"), {"reason": "too late"})
    assert response.status_code == 302
    assert any("Cancel is not possible now: the job is completed" in t for t in texts(response))
    assert Job.objects.get(pk=job.pk).status == Status.COMPLETED
    assert not JobEvent.objects.filter(job=job, reason="too late").exists()


def test_an_operation_the_page_does_not_offer_is_refused_on_post(admin_client: Any) -> None:
    # Force cancel is offered once a cancel was requested; a crafted POST on a running
    # job without one cancelled it at once, its handler never asked to stop.
    job = processing()
    response = admin_client.post(act_url(job, "force_cancel"), {"reason": "crafted"})
    assert response.status_code == 302
    assert any("Force cancel is not possible now" in t for t in texts(response))
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and not job.events.filter(transition="cancel").exists()


def test_an_operation_on_a_job_deleted_since_its_page_says_so(admin_client: Any, viewer: Any) -> None:
    # A 404 page, for the confirmation's POST and for a button of a page read before.
    job = completed()
    Job.objects.filter(pk=job.pk).delete()
    for response in (
        admin_client.post(act_url(job, "retry"), {"reason": "again"}),
        admin_client.get(act_url(job, "retry")),
    ):
        assert response.status_code == 302 and response["Location"] == LIST
        assert f"Retry refused: job {job.pk} does not exist (any more)." in texts(response)
    assert not Job.objects.exists()
    admin_client.force_login(viewer)  # no permission: 403 first, whether the job exists or not
    assert admin_client.post(act_url(job, "retry"), {"reason": "again"}).status_code == 403


def test_stale_get_of_disallowed_operation_redirects_with_message(admin_client: Any) -> None:
    job = completed()
    response = admin_client.get(act_url(job, "requeue"))
    assert response.status_code == 302
    assert any("not possible now" in t for t in texts(response))


def test_unknown_operation_is_refused(admin_client: Any) -> None:
    job = queued()
    assert admin_client.post(act_url(job, "complete"), {"reason": "x"}).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


# --- permissions --------------------------------------------------------------------


def test_staff_without_permissions_is_refused(client: Any, staff_user: Any) -> None:
    job = queued()
    client.force_login(staff_user)
    assert client.get(LIST).status_code == 403
    assert client.get(change_url(job)).status_code == 403
    assert client.post(act_url(job, "cancel"), {"reason": "x"}).status_code == 403
    assert client.get(reverse("admin:jobstate_job_stuck")).status_code == 403
    assert client.get(reverse("admin:jobstate_job_dashboard")).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_viewer_sees_jobs_but_cannot_act(client: Any, viewer: Any) -> None:
    job = queued()
    client.force_login(viewer)
    html = client.get(change_url(job)).content.decode()
    assert "Transition history" in html and "/act/" not in html
    for name in ("cancel", "fail"):
        assert client.get(act_url(job, name)).status_code == 403
        assert client.post(act_url(job, name), {"reason": "x"}).status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    # No bulk actions are offered to a viewer.
    html = client.get(LIST).content.decode()
    assert "cancel_selected" not in html and "retry_selected" not in html


def test_each_operation_needs_its_own_permission(client: Any, django_user_model: Any) -> None:
    from tests.admin_support import grant

    user = django_user_model.objects.create_user("cancel-only", password="pw-123456", is_staff=True)
    user = grant(user, "view_job", "cancel_job")
    client.force_login(user)
    job = queued()
    done = completed()
    assert client.post(act_url(done, "retry"), {"reason": "x"}).status_code == 403
    assert client.post(act_url(job, "fail"), {"reason": "x"}).status_code == 403
    assert client.post(act_url(job, "cancel"), {"reason": "ok"}).status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert not Job.objects.filter(retry_of=done).exists()
    html = client.get(LIST).content.decode()
    assert "cancel_selected" in html and "retry_selected" not in html


# --- bulk actions -----------------------------------------------------------------------


def bulk(client: Any, action: str, jobs: list[Job], reason: str | None) -> Any:
    data: dict[str, Any] = {"action": action, "_selected_action": [str(j.pk) for j in jobs], "index": 0}
    if reason is not None:
        data.update(confirm="yes", reason=reason)
    return client.post(LIST, data)


def test_bulk_cancel_reports_done_and_refused(admin_client: Any, admin_user: Any) -> None:
    a, b, c, d = queued(), processing(), completed(), failed()
    page = bulk(admin_client, "cancel_selected", [a, b, c, d], None)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="reason"' in html and "2 of the 4 selected jobs" in html
    response = bulk(admin_client, "cancel_selected", [a, b, c, d], "maintenance window")
    assert response.status_code == 302
    messages = texts(response)
    assert "Cancelled or asked to stop 2 jobs." in messages
    refused = [m for m in messages if m.startswith("Refused")]
    cancellable = "only a queued, waiting or running job can be cancelled"
    assert any(f"Refused 1 job: the job is completed; {cancellable}" in m for m in refused)
    assert any(f"Refused 1 job: the job is failed; {cancellable}" in m for m in refused)
    assert Job.objects.get(pk=a.pk).status == Status.CANCELLED
    assert Job.objects.get(pk=b.pk).cancel_requested_at is not None
    for job in (a, b):
        event = last_event(job)
        assert (event.actor, event.actor_label, event.reason) == (admin_user, "admin", "maintenance window")


def test_bulk_confirmation_counts_what_will_be_done_and_why_the_rest_is_refused(admin_client: Any) -> None:
    # 1 cancellable of 6 read "Cancel 6 jobs" with "1 of the 6 ... can be cancelled";
    # retry read "can be retryd"; "the others will be refused" showed with none.
    asked = processing()
    services.request_cancel(asked, "ops", "first")
    jobs = [queued(), completed(), completed(), completed(), failed(), asked]
    page = bulk(admin_client, "cancel_selected", jobs, None).content.decode()
    assert "<title>Cancel 1 job |" in page and 'value="Cancel 1 job"' in page
    assert (
        "1 of the 6 selected jobs can be cancelled in their current state; 5 will be refused "
        "(3 completed, 1 failed, 1 already asked to stop) and listed with the reason."
    ) in page
    done, retried = completed(), failed()
    services.retry(retried, "ops", "fixed")
    page = bulk(admin_client, "retry_selected", [done], None).content.decode()
    assert "The selected job can be retried in its current state." in page
    assert "refused" not in page and 'value="Retry 1 job"' in page
    assert "linked to this one; this job and its history" in page
    page = bulk(admin_client, "retry_selected", [done, retried], None).content.decode()
    assert "; 1 will be refused (1 already retried)" in page
    # For several jobs the summary said "linked to this one; this job and its history".
    page = bulk(admin_client, "retry_selected", [done, failed()], None).content.decode()
    assert "2 of the 2 selected jobs can be retried in their current state." in page
    assert (
        '<p id="js-bulk-summary">For each job, a new job with the same kind and parameters is queued, '
        "linked to it; the selected jobs and their history stay as they are.</p>"
    ) in page


def rows() -> tuple[list[tuple[Any, ...]], int]:
    """Every job as its columns an operation changes, and the number of history rows."""
    jobs = Job.objects.order_by("pk").values_list("pk", "status", "cancel_requested_at", "updated_at")
    return list(jobs), JobEvent.objects.count()


def test_a_bulk_action_nothing_selected_can_take_offers_no_confirmation(admin_client: Any) -> None:
    # It offered "Cancel 0 jobs", a button that did nothing.
    asked = processing()
    services.request_cancel(asked, "ops", "first")
    jobs = [completed(), completed(), asked]  # counts apart: groups of one size keep no set order
    page = bulk(admin_client, "cancel_selected", jobs, None).content.decode()
    assert "<title>Nothing to cancel |" in page
    assert (
        "<strong>None of the 3 selected jobs can be cancelled in their current state</strong> "
        "(2 completed, 1 already asked to stop): there is nothing to confirm."
    ) in page
    assert 'type="submit"' not in page.split('id="content-main"')[1] and 'name="confirm"' not in page
    role = ' role="button"' if django.VERSION >= (6, 0) else ""  # as Django's admin marks it
    assert f'<a{role} href="{LIST}" class="closelink">Back</a>' in page
    retried = completed()
    services.retry(retried, "ops", "fixed")
    page = bulk(admin_client, "retry_selected", [retried], None).content.decode()
    assert "<title>Nothing to retry |" in page and 'name="confirm"' not in page
    assert "The selected job cannot be retried in its current state</strong> (1 already retried)" in page
    page = bulk(admin_client, "retry_selected", [queued(), queued(), retried], None).content.decode()
    assert "(2 queued, 1 already retried)" in page and 'name="confirm"' not in page


def test_a_bulk_confirmation_posted_when_nothing_selected_can_take_it_writes_nothing(
    admin_client: Any,
) -> None:
    # A page read before the jobs changed, or a crafted POST: it called the services job by job.
    asked = processing()
    services.request_cancel(asked, "ops", "first")
    done, retried, running = [completed(), completed()], completed(), processing()
    services.retry(retried, "ops", "fixed")
    before = rows()
    for reason in ("wrong input", ""):  # not "Give a reason." either: there is nothing to do
        response = bulk(admin_client, "cancel_selected", [*done, asked], reason)
        assert response.status_code == 302
        assert texts(response) == [
            "Nothing cancelled: none of the selected jobs can be cancelled now "
            "(2 completed, 1 already asked to stop)."
        ]
        admin_client.get(LIST)  # shows the message, so the next response holds its own only
    response = bulk(admin_client, "retry_selected", [retried, asked, running], "again")
    assert texts(response) == [
        "Nothing retried: none of the selected jobs can be retried now (2 processing, 1 already retried)."
    ]
    assert rows() == before


def test_bulk_retry_says_which_selected_jobs_are_workflows_run_again_from_their_first_step(
    admin_client: Any,
) -> None:
    # The job page's Retry said so; the bulk one reran workflows from step one silently.
    workflow = services.enqueue("wf.fixable", {})
    drain(kinds=["wf.fixable"])  # step two fails
    page = bulk(admin_client, "retry_selected", [workflow, failed()], None).content.decode()
    assert (
        '<p id="js-bulk-workflows"><strong>1 of them is a workflow: each runs again from its first step'
        in page
    )
    plain = bulk(admin_client, "retry_selected", [failed()], None).content.decode()
    assert "js-bulk-workflows" not in plain


def test_bulk_cancel_without_reason_asks_again(admin_client: Any) -> None:
    job = queued()
    response = bulk(admin_client, "cancel_selected", [job], "")
    assert response.status_code == 200 and "Give a reason." in response.content.decode()
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_bulk_retry(admin_client: Any, admin_user: Any) -> None:
    a, b, c = completed(), failed(), queued()
    response = bulk(admin_client, "retry_selected", [a, b, c], "rerun after fix")
    messages = texts(response)
    assert "Queued a retry for 2 jobs." in messages
    # It said "Cannot move job from 'queued' to 'queued' (retry)", where the CLI said why.
    refusal = f"Refused 1 job: the job is queued; only a finished job can be retried ({short(c.pk)})"
    assert refusal in messages
    for old in (a, b):
        new = Job.objects.get(retry_of=old)
        assert last_event(new).actor == admin_user and last_event(new).reason == "rerun after fix"


def waiting() -> Job:
    """A job suspended by its handler (a fan-out waiting for its child)."""
    job = processing()
    queued(parent=job, run_after=timezone.now() + timedelta(hours=1))
    services.suspend(job, job.lease_token)
    return Job.objects.get(pk=job.pk)


def test_bulk_requeue_says_which_jobs_wait_for_their_lease_and_requeues_each_through_the_service(
    admin_client: Any, admin_user: Any
) -> None:
    # The job page had Requeue…, the list no bulk one: 40 stuck jobs were requeued one by one.
    running, lost, asleep = processing(lease_seconds=600), expired(), waiting()
    done, ready = completed(), queued()
    selected = [running, lost, asleep, done, ready]
    page = bulk(admin_client, "requeue_selected", selected, None).content.decode()
    assert "<title>Requeue 3 jobs |" in page and 'value="Requeue 3 jobs"' in page
    assert "3 of the 5 selected jobs can be requeued in their current state; 2 will be refused" in page
    assert "1 completed" in page and "1 queued" in page
    lease_end = display.exact_time(running.lease_expires_at)
    assert (
        f'<p id="js-bulk-lease"><strong>1 of them holds a lease that still runs (until {lease_end}): '
        "its handler may run until then, so its next attempt waits until that lease would have run "
        "out, when the worker's watchdog has stopped it.</strong></p>"
    ) in page
    assert "1 of them is waiting: it is woken and queued now" in page
    before = timezone.now()
    response = bulk(admin_client, "requeue_selected", selected, "worker host crashed")
    assert response.status_code == 302
    messages = texts(response)
    assert (
        f"Requeued 3 jobs. 1 of them starts its next attempt after {lease_end}, when its old lease "
        "would have run out."
    ) in messages
    requeueable = "only a running or waiting job can be requeued"
    assert f"Refused 1 job: the job is completed; {requeueable} ({short(done.pk)})" in messages
    assert f"Refused 1 job: the job is queued; {requeueable} ({short(ready.pk)})" in messages
    after = {j.pk: Job.objects.get(pk=j.pk) for j in selected}
    assert {after[j.pk].status for j in (running, lost, asleep)} == {Status.QUEUED}
    assert after[running.pk].run_after == running.lease_expires_at  # held until its lease ran out
    assert after[lost.pk].run_after >= before and after[asleep.pk].run_after >= before
    for job in (running, lost, asleep):
        event = last_event(job)
        assert (event.actor, event.actor_label, event.reason) == (admin_user, "admin", "worker host crashed")
    assert [last_event(j).transition for j in (running, lost, asleep)] == ["requeue", "requeue", "wake"]
    assert (after[done.pk].status, after[ready.pk].status) == (Status.COMPLETED, Status.QUEUED)


def test_bulk_requeue_of_several_jobs_whose_lease_still_runs_names_the_last_lease_end(
    admin_client: Any,
) -> None:
    short_lease, long_lease = processing(lease_seconds=300), processing(lease_seconds=900)
    last = display.exact_time(long_lease.lease_expires_at)
    page = bulk(admin_client, "requeue_selected", [short_lease, long_lease], None).content.decode()
    assert f"2 of them hold a lease that still runs (the last until {last}): the handler of each" in page
    assert "js-bulk-woken" not in page
    messages = texts(bulk(admin_client, "requeue_selected", [short_lease, long_lease], "worker hung"))
    assert messages == [
        f"Requeued 2 jobs. 2 of them start their next attempt only when their old lease would have "
        f"run out, the last after {last}."
    ]


def test_bulk_requeue_speaks_of_one_job_as_one_and_names_a_paused_kind(admin_client: Any) -> None:
    # Several jobs got "The job goes back to the queue"; one got "1 of them holds a lease",
    # and nothing said a paused kind's jobs stay queued, while the page promised a run.
    running = processing(lease_seconds=600)
    several = [processing(lease_seconds=600), expired()]
    services.pause_kind(running.kind, "ops", "incident")
    lease_end = display.exact_time(running.lease_expires_at)
    page = bulk(admin_client, "requeue_selected", [running], None).content.decode()
    assert f"<strong>It holds a lease that still runs (until {lease_end}): its handler" in page
    assert "1 of them" not in page
    assert (
        f'<p id="js-bulk-paused"><strong>Its kind is paused ({running.kind}): no worker claims it '
        "until it is resumed.</strong></p>"
    ) in page
    assert texts(bulk(admin_client, "requeue_selected", [running], "worker hung")) == [
        f"Requeued 1 job. Its next attempt starts after {lease_end}, when its old lease would have run out."
    ]
    page = bulk(admin_client, "requeue_selected", several, None).content.decode()
    assert "Each job goes back to the queue; its current worker" in page
    assert "2 of them are of a kind that is paused" in page


def test_bulk_requeue_asks_for_a_reason_and_writes_nothing_when_no_job_can_be_requeued(
    admin_client: Any,
) -> None:
    job = expired()
    response = bulk(admin_client, "requeue_selected", [job], "")
    assert response.status_code == 200 and "Give a reason." in response.content.decode()
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING
    jobs = [completed(), completed(), queued()]
    page = bulk(admin_client, "requeue_selected", jobs, None).content.decode()
    assert "<title>Nothing to requeue |" in page and 'name="confirm"' not in page
    assert "js-bulk-lease" not in page and "js-bulk-woken" not in page
    before = rows()
    response = bulk(admin_client, "requeue_selected", jobs, "crash")
    assert texts(response) == [
        "Nothing requeued: none of the selected jobs can be requeued now (2 completed, 1 queued)."
    ]
    assert rows() == before


def test_bulk_requeue_needs_the_requeue_permission(client: Any, django_user_model: Any) -> None:
    job = expired()
    staff = django_user_model.objects.create_user("ops", password="pw-123456", is_staff=True)
    client.force_login(grant(staff, "view_job", "cancel_job", "retry_job"))
    assert "requeue_selected" not in client.get(LIST).content.decode()
    assert bulk(client, "requeue_selected", [job], "crash").status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.PROCESSING
    client.force_login(grant(staff, "requeue_job"))
    assert "requeue_selected" in client.get(LIST).content.decode()
    assert bulk(client, "requeue_selected", [job], "crash").status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED


def test_a_bulk_action_the_user_may_not_run_is_refused_with_403(
    client: Any, viewer: Any, django_user_model: Any
) -> None:
    # Django answered it with the list page (no message for a viewer, "No action
    # selected." for the others): a confirmation posted after a permission was taken
    # away looked done.
    from tests.admin_support import grant

    job, done = queued(), completed()
    client.force_login(viewer)
    assert bulk(client, "cancel_selected", [job], "x").status_code == 403
    assert bulk(client, "retry_selected", [done], None).status_code == 403
    canceller = grant(
        django_user_model.objects.create_user("cancel-only", password="pw-123456", is_staff=True),
        "view_job",
        "cancel_job",
    )
    client.force_login(canceller)
    assert bulk(client, "retry_selected", [done], "x").status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED
    assert not Job.objects.filter(retry_of=done).exists()
    assert bulk(client, "cancel_selected", [job], "x").status_code == 302
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


def test_bulk_action_reports_the_selected_jobs_gone_since_the_confirmation(admin_client: Any) -> None:
    # They were left out in silence: "Queued a retry for 1 job." of 3 selected, and
    # "No jobs selected." when every one was gone.
    kept, gone, retried = completed(), completed(), completed()
    ids = [kept, gone, retried]
    assert "3 of the 3 selected jobs" in bulk(admin_client, "retry_selected", ids, None).content.decode()
    Job.objects.filter(pk=gone.pk).delete()  # retention, say
    services.retry(retried, "ops", "first")  # another operator
    messages = texts(bulk(admin_client, "retry_selected", ids, "rerun"))
    assert "Queued a retry for 1 job." in messages
    assert (
        "Refused 1 job: no longer in the list (deleted meanwhile, or no longer matching its "
        f"filters) ({short(gone.pk)})"
    ) in messages
    assert any(m.startswith("Refused 1 job: already retried") for m in messages)
    assert Job.objects.filter(retry_of=kept).count() == 1
    Job.objects.filter(pk=kept.pk).delete()
    messages = texts(bulk(admin_client, "cancel_selected", [kept, gone], "stop"))
    assert "No jobs selected." not in messages
    assert f"({short(kept.pk)}, {short(gone.pk)})" in messages[-1] and "Refused 2 jobs" in messages[-1]


def test_bulk_cancel_refuses_already_requested(admin_client: Any) -> None:
    job = processing()
    services.request_cancel(job, "someone", "first")
    response = bulk(admin_client, "cancel_selected", [job, queued()], "second")
    messages = texts(response)
    assert "Cancelled or asked to stop 1 job." in messages
    assert any("a cancel was already requested" in m for m in messages)
    assert not JobEvent.objects.filter(job=job, reason="second").exists()


def test_admin_index_links_dashboard_and_stuck(admin_client: Any) -> None:
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:jobstate_job_dashboard") in html and reverse("admin:jobstate_job_stuck") in html
    html = admin_client.get(reverse("admin:app_list", args=["jobstate"])).content.decode()
    assert reverse("admin:jobstate_job_dashboard") in html
    html = admin_client.get(LIST).content.decode()
    assert reverse("admin:jobstate_job_dashboard") in html and reverse("admin:jobstate_job_stuck") in html


def test_only_the_indexed_column_sorts(admin_client: Any) -> None:
    first = queued()
    second = queued()
    html = admin_client.get(LIST).content.decode()
    table = html.index('id="result_list"')
    head = html[table : html.index("</thead>", table)]
    sortable = re.findall(r'<th scope="col"\s+class="([^"]*)"', head)
    assert [c for c in sortable if "sortable" in c] == [next(c for c in sortable if "created_col" in c)]
    (index,) = set(re.findall(r'href="\?o=-?(\d+)', head))
    html = admin_client.get(f"{LIST}?o={index}").content.decode()
    assert html.index(short(first.pk)) < html.index(short(second.pk))  # oldest first
    html = admin_client.get(f"{LIST}?o=-{index}").content.decode()
    assert html.index(short(second.pk)) < html.index(short(first.pk))


def test_a_job_already_retried_is_refused_in_bulk_and_alone(admin_client: Any) -> None:
    # The stuck page never offered it; the bulk action and the job page queued a second retry.
    old, fresh = failed(), failed()
    first = services.retry(old, "ops", "fixed")
    response = bulk(admin_client, "retry_selected", [old, fresh], "rerun after fix")
    messages = texts(response)
    assert "Queued a retry for 1 job." in messages
    assert (
        "Refused 1 job: already retried, as the job named after each; retry that one instead "
        f"({short(old.pk)} as {short(first.pk)})"
    ) in messages
    response = admin_client.post(act_url(old, "retry"), {"reason": "once more"})
    refusal = f"Retry refused: Job {old.pk} was already retried as job {first.pk}: retry that one instead."
    assert refusal in texts(response)
    assert list(Job.objects.filter(retry_of=old.pk)) == [first]


def test_a_job_already_retried_is_offered_no_retry(admin_client: Any) -> None:
    # The service refuses a second retry; the job page offered the button and the
    # bulk confirmation counted the job among those that can be retried.
    old, fresh = failed(), failed()
    services.retry(old, "ops", "fixed")
    offered = set(re.findall(r"/act/([a-z_]+)/", admin_client.get(change_url(old)).content.decode()))
    assert offered == set()
    page = bulk(admin_client, "retry_selected", [old, fresh], None).content.decode()
    assert "1 of the 2 selected jobs" in page


def test_bulk_cancel_of_a_parent_before_its_children_counts_them_cancelled(admin_client: Any) -> None:
    # The parent's cancel cancels its children first; each was then refused,
    # "Cannot move job from 'cancelled' to 'cancelled'".
    parent = processing()
    child = queued(parent=parent)
    grandchild = queued(parent=child)
    other = completed()
    # The list runs newest first: the parent goes first here.
    Job.objects.filter(pk=parent.pk).update(created_at=timezone.now() + timedelta(hours=1))
    response = bulk(admin_client, "cancel_selected", [parent, child, grandchild, other], "wrong input")
    messages = texts(response)
    assert "Cancelled or asked to stop 3 jobs." in messages
    refused = [m for m in messages if m.startswith("Refused")]
    assert refused == [
        "Refused 1 job: the job is completed; only a queued, waiting or running job can be cancelled "
        f"({short(other.pk)})"
    ]
    assert Job.objects.get(pk=parent.pk).cancel_requested_at is not None
    assert {Job.objects.get(pk=j.pk).status for j in (child, grandchild)} == {Status.CANCELLED}


def test_retry_of_a_job_whose_kind_is_gone_says_so(admin_client: Any) -> None:
    # It said "Unknown job kind 'x'." as if the operator had typed a kind; the API and
    # `manage.py jobstate retry` say why the job cannot be retried.
    done, other = completed(), completed()
    Job.objects.filter(pk__in=[done.pk, other.pk]).update(kind="gone.kind")
    why = "This job's kind 'gone.kind' is no longer registered: it cannot be retried."
    assert any(why in m for m in texts(bulk(admin_client, "retry_selected", [done], "again")))
    page = admin_client.post(act_url(other, "retry"), {"reason": "again"}, follow=True)
    assert html.escape(why) in page.content.decode()
    assert not Job.objects.filter(retry_of__in=[done, other]).exists()


def test_deleting_a_job_needs_the_job_view_permission(client: Any, django_user_model: Any) -> None:
    # The delete page names the job and everything below it: delete_job alone reaches
    # neither it nor the delete (nor the bulk action), as for assets.
    job = completed()
    staff = django_user_model.objects.create_user("d", password="pw-123456", is_staff=True)
    url = reverse("admin:jobstate_job_delete", args=[job.pk])
    client.force_login(grant(staff, "delete_job"))
    response = client.get(url)
    assert response.status_code == 403 and job.kind not in response.content.decode()
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()
    client.force_login(grant(staff, "view_job"))
    assert client.get(url).status_code == 200
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
