"""One rule says which ended jobs ``services.retry`` accepts
(``jobstate.services.retryable``): the stuck page offers "retry" (reason
``recently_failed``) for a failed job exactly when the service would accept it,
apart from the page's own limits (recent, not failed by an operator, its key not
taken by a later job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobstate import registry, services, stuck
from jobstate.exceptions import AlreadyRetried, ParentEnded, UnknownKind
from jobstate.models import Job
from jobstate.services.control import DuplicateActiveKey
from tests.admin_support import KIND, failed, processing, queued

pytestmark = pytest.mark.django_db


def offered(job: Job) -> bool:
    """Whether the stuck page (its list, its count, the job's own finding) offers a retry."""
    listed = {f.job.pk for f in stuck.find_stuck(codes=[stuck.RECENTLY_FAILED])}
    finding = stuck.check(Job.objects.get(pk=job.pk))
    offers = finding is not None and finding.remedy == stuck.RETRY
    counted = stuck.count_stuck(codes=[stuck.RECENTLY_FAILED])[stuck.RECENTLY_FAILED]
    assert (job.pk in listed) == offers and counted == len(listed), (listed, finding, counted)
    return offers


def failed_child(parent: Job) -> Job:
    child = services.start(queued(parent=parent), "w-child")
    services.fail(child, child.lease_token, "boom", retry=False)
    return Job.objects.get(pk=child.pk)


def retried_already(temp_handler: Any) -> Job:
    job = failed()
    services.retry(job)
    return job


def parent_failed(temp_handler: Any) -> Job:
    parent = processing()
    child = failed_child(parent)
    services.fail(parent, parent.lease_token, "a child failed", retry=False)
    return child


def parent_cancelled(temp_handler: Any) -> Job:
    parent = processing()
    child = failed_child(parent)
    services.request_cancel(parent, "ops", "stop")
    services.cancel_now(parent, parent.lease_token)
    return child


def parent_being_cancelled(temp_handler: Any) -> Job:
    # The parent still runs, asked to cancel: a child queued now would escape the cascade.
    parent = processing()
    child = failed_child(parent)
    services.request_cancel(parent, "ops", "stop")
    assert Job.objects.get(pk=parent.pk).status == "processing"
    return child


def kind_gone(temp_handler: Any) -> Job:
    temp_handler("test.gone")
    job = failed(kind="test.gone")
    registry.unregister("test.gone")  # its handler was removed since
    return job


REFUSED: list[tuple[Callable[[Any], Job], type[Exception]]] = [
    (retried_already, AlreadyRetried),
    (parent_failed, ParentEnded),
    (parent_cancelled, ParentEnded),
    (parent_being_cancelled, ParentEnded),
    (kind_gone, UnknownKind),
]


@pytest.mark.parametrize(("make", "refusal"), REFUSED, ids=[m.__name__ for m, _ in REFUSED])
def test_the_stuck_page_offers_no_retry_the_service_refuses(
    make: Callable[[Any], Job], refusal: type[Exception], temp_handler: Any
) -> None:
    # A retry the page offered and the service refused stayed on the page for a day.
    job = make(temp_handler)
    assert not offered(job)
    with pytest.raises(refusal):
        services.retry(job)


def test_an_active_job_holding_the_key_refuses_the_retry_and_the_page_offers_none() -> None:
    job = failed(key="report")
    services.enqueue(KIND, {"n": 3}, key="report")
    assert not offered(job)
    with pytest.raises(DuplicateActiveKey):
        services.retry(job)


@pytest.mark.parametrize("case", ["plain", "keyed", "child_of_completed", "child_of_running"])
def test_every_retry_the_stuck_page_offers_is_accepted(case: str, django_user_model: Any) -> None:
    if case == "plain":
        job = failed()
    elif case == "keyed":
        # Another owner's active job with the same key takes nothing from it.
        job = failed(key="report")
        services.enqueue(KIND, {"n": 3}, key="report", owner=django_user_model.objects.create_user("bob"))
    else:
        parent = processing(lease_seconds=3600)
        job = failed_child(parent)
        if case == "child_of_completed":
            services.complete(parent, parent.lease_token, {})
    assert offered(job)
    new = services.retry(job)
    assert new.retry_of_id == job.pk and not offered(job)


def test_the_rule_is_one_filter_for_a_list_and_the_checks_of_the_service(temp_handler: Any) -> None:
    from jobstate.services.retryable import retryable_q

    ok = failed()
    refused = [make(temp_handler) for make, _ in REFUSED]
    still_running = processing()
    matching = set(Job.objects.filter(retryable_q()).values_list("pk", flat=True))
    assert ok.pk in matching and still_running.pk not in matching
    assert not matching & {job.pk for job in refused}


def test_the_stuck_page_asks_a_fixed_number_of_queries_however_many_jobs_failed() -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            stuck.find_stuck(codes=[stuck.RECENTLY_FAILED])
            stuck.count_stuck(codes=[stuck.RECENTLY_FAILED])
        return len(captured)

    failed()
    one = queries()
    for _ in range(4):
        failed(key=None)
    parent = processing(lease_seconds=3600)
    failed_child(parent)
    assert queries() == one
