# invoices/tests/test_jobs.py: pytest with pytest-django.
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from invoices.tasks import send_receipt

from jobstate import services, testing
from jobstate.models import JobStep
from jobstate.tasks import enqueue_on_commit

pytestmark = pytest.mark.django_db


def test_render(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path  # assets are written to the default storage
    job = services.enqueue("invoices.render", {"lines": 3})
    assert testing.drain() == 1
    job.refresh_from_db()
    assert job.status == "completed"
    assert job.result == {"lines": 3}
    assert (job.progress, job.progress_message) == (100, "line 3 of 3")
    asset = job.assets.get(asset_type="invoice")
    assert asset.name == "invoice.txt" and asset.file.read() == b"INVOICE\n" * 3
    assert testing.transitions(job) == ["enqueue", "claim", "complete"]


def test_retries_with_backoff():
    job = services.enqueue("invoices.send", {})
    assert testing.drain() == 1  # attempt 1 fails: queued again, 60 s from now
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 1 and job.run_after > timezone.now()
    assert testing.drain() == 0  # not due yet
    assert testing.drain(now=timezone.now() + timedelta(hours=1)) == 2  # attempts 2 and 3
    job.refresh_from_db()
    assert job.status == "completed" and job.attempts == 3
    assert testing.transitions(job) == [
        "enqueue",
        "claim",
        "requeue",
        "claim",
        "requeue",
        "claim",
        "complete",
    ]


def test_failing_handler():
    job = services.enqueue("invoices.void", {"number": 7})
    testing.drain()
    job.refresh_from_db()
    assert job.status == "failed" and job.attempts == 1  # NonRetryable: never retried
    assert (job.error_type, job.error_message) == ("NonRetryable", "invoice 7 was paid")
    assert "NonRetryable" in job.traceback
    failure = job.events.last()
    assert (failure.transition, failure.from_status, failure.to_status) == ("fail", "processing", "failed")


def test_workflow_fans_out():
    job = services.enqueue("invoices.month", {"customers": [1, 2]})
    assert testing.drain() == 4  # the workflow, its 2 children, the workflow again
    job.refresh_from_db()
    assert job.status == "completed" and job.result == {"invoices": 2}
    assert job.children.count() == 2 and not job.children.exclude(status="completed").exists()
    steps = JobStep.objects.filter(job=job).order_by("position")
    assert [(s.name, s.status) for s in steps] == [("render", "completed"), ("total", "completed")]


def test_django_task():
    result = send_receipt.enqueue(42)  # a Job, run by drain() as any other
    testing.drain()
    result.refresh()
    assert result.status == "SUCCESSFUL" and result.return_value == "receipt 42 sent"


def test_enqueue_on_commit(django_capture_on_commit_callbacks):
    # The test's transaction never commits: an on_commit enqueue waits forever...
    with transaction.atomic():
        enqueue_on_commit(send_receipt, 1)
    assert testing.drain() == 0
    # ...unless the test runs the callbacks, as a commit would.
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_on_commit(send_receipt, 2)
    assert testing.drain() == 1
