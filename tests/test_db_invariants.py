"""The database's own guards of the rows beside the job (history, workflow steps,
webhook deliveries): a writer that bypasses the services (``QuerySet.update``,
``bulk_create``) cannot store a row the services would never write."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobstate import services
from jobstate.models import Job, JobEvent, JobStep
from jobstate.states import Status
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def refused(write: Any) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        write()


def test_a_history_row_names_statuses_at_both_ends() -> None:
    job = services.enqueue("test.echo", {})
    enqueue = JobEvent.objects.filter(job=job)
    for values in ({"to_status": "bogus"}, {"to_status": ""}, {"from_status": "done"}):
        refused(lambda values=values: enqueue.update(**values))
    refused(
        lambda: JobEvent.objects.bulk_create(
            [JobEvent(job=job, from_status="queued", to_status="finished", transition="x")]
        )
    )
    # What the services write still fits: an enqueue's empty start, a request's equal ends.
    services.claim("w1")
    services.request_cancel(job, "test", "stop")
    rows = list(JobEvent.objects.filter(job=job).values_list("from_status", "to_status", "transition"))
    assert rows == [
        ("", Status.QUEUED, "enqueue"),
        (Status.QUEUED, Status.PROCESSING, "claim"),
        (Status.PROCESSING, Status.PROCESSING, "request_cancel"),
    ]


def test_a_failed_step_has_an_error() -> None:
    job = services.enqueue("test.echo", {})
    JobStep.objects.create(job=job, position=0, name="load")
    step = JobStep.objects.filter(job=job, name="load")
    refused(lambda: step.update(status="failed", finished_at=timezone.now()))
    refused(
        lambda: JobStep.objects.bulk_create(
            [JobStep(job=job, position=1, name="save", status="failed", finished_at=timezone.now())]
        )
    )
    assert step.update(status="failed", finished_at=timezone.now(), error_message="boom") == 1


def test_a_delivery_marked_ok_got_a_2xx_answer() -> None:
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/in")
    job = Job.objects.create(kind="test.echo")
    delivery = WebhookDelivery.objects.create(endpoint=endpoint, webhook_id="msg_1", event="e", job_id=job.pk)
    row = WebhookDelivery.objects.filter(pk=delivery.pk)
    refused(lambda: row.update(ok=True))  # no answer at all
    for code in (199, 302, 500):
        refused(lambda code=code: row.update(ok=True, status_code=code))
    refused(
        lambda: WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(endpoint=endpoint, webhook_id="m", event="e", job_id=job.pk, ok=True)]
        )
    )
    assert row.update(status_code=500) == 1  # a failed attempt keeps its answer
    assert row.update(ok=True, status_code=204) == 1
