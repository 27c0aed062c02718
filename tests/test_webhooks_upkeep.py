"""Webhooks over time: a whole-request deadline against receivers that drip
their answer, and pruning of old delivery records with the jobs."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from jobstate import registry, services
from jobstate.models import Job
from jobstate.webhooks import delivery, outbox, transport
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobstate.worker.limits import timeout_for
from jobstate.worker.retention import prune
from jobstate.worker.runner import drain, hard_limit_for
from tests.webhook_support import DRIPPED_BODY

pytestmark = pytest.mark.django_db

ALLOW = {"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_BACKOFF_BASE": 0}


@pytest.fixture(autouse=True)
def fresh_answers():
    outbox.forget()
    yield
    outbox.forget()


# --- the whole-request deadline -------------------------------------------------
#
# The receiver sends a byte every 25 ms: no single connect or read waits anywhere
# near WEBHOOK_TIMEOUT, but the whole answer (about 260 bytes) takes 6-7 s.


@pytest.mark.parametrize("body_only", [False, True], ids=["status-and-headers", "body"])
@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_TIMEOUT": 1.0, "WEBHOOK_MAX_ATTEMPTS": 1})
def test_a_receiver_dripping_its_answer_is_cut_off_at_the_deadline(user, receiver, body_only):
    receiver.drip, receiver.drip_body_only = 0.025, body_only
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    started = time.monotonic()
    drain()
    elapsed = time.monotonic() - started
    assert len(receiver.requests) == 1
    (row,) = WebhookDelivery.objects.all()
    assert not row.ok and row.status_code is None
    assert "DeadlineExceeded" in row.error and "1.0 s" in row.error, row.error
    assert 900 <= row.duration_ms < 2500, row.duration_ms
    assert elapsed < 3, elapsed
    (sent,) = Job.objects.filter(kind=outbox.KIND)
    assert sent.status == "failed" and "WEBHOOK_TIMEOUT" in sent.error_message


@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_TIMEOUT": 10.0})
def test_a_slow_answer_within_the_deadline_is_read_whole(receiver):
    receiver.drip, receiver.drip_body_only = 0.002, True
    response = transport.post(receiver.url, b"{}", {})
    assert (response.status, response.body) == (200, DRIPPED_BODY)
    assert response.seconds < 10


@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_TIMEOUT": 0.5})
def test_the_deadline_also_bounds_a_receiver_that_never_answers(receiver):
    receiver.holds = 1  # keeps the request open until released (60 s at most)
    started = time.monotonic()
    with pytest.raises(transport.DeadlineExceeded):
        transport.post(receiver.url, b"{}", {})
    assert time.monotonic() - started < 2


@pytest.fixture
def tls_dripper() -> Iterator[str]:
    """An https URL on 127.0.0.1 whose server, after the ClientHello, announces a
    16 KiB handshake record and drips it a byte every 25 ms (for 6 s at most)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"\x16\x03\x03\x40\x00")
            ends = time.monotonic() + 6
            while not stop.is_set() and time.monotonic() < ends:
                try:
                    conn.sendall(b"\x00")
                except OSError:
                    return
                time.sleep(0.025)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.getsockname()[1]}/hook"
    stop.set()
    server.close()
    thread.join(10)


@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_TIMEOUT": 1.0})
def test_the_deadline_also_bounds_a_dripping_tls_handshake(tls_dripper):
    started = time.monotonic()
    with pytest.raises(transport.DeadlineExceeded):
        transport.post(tls_dripper, b"{}", {})
    assert time.monotonic() - started < 2


# --- retention ------------------------------------------------------------------


def delivery_limits(webhook_timeout: object) -> tuple[float, int]:
    """The delivery kind's time limit and hard limit as registered (at startup)
    with this WEBHOOK_TIMEOUT; registered again as the test settings have it after."""
    try:
        with override_settings(JOBSTATE={"WEBHOOK_TIMEOUT": webhook_timeout}):
            delivery.install(delivery._serializer)
            spec = registry.get_handler(outbox.KIND)
            return timeout_for(spec), hard_limit_for(spec)
    finally:
        delivery.install(delivery._serializer)


@pytest.mark.parametrize("webhook_timeout", [5.0, 120, 300.0])
def test_a_delivery_attempt_has_time_for_the_whole_request_and_the_dns_lookup(webhook_timeout):
    """The delivery kind had a fixed 60 s time limit: with a WEBHOOK_TIMEOUT above
    it, a slow receiver's attempt was stopped by the worker (and killed at its
    hard limit) instead of timing out as a failed request."""
    timeout, hard = delivery_limits(webhook_timeout)
    assert timeout == webhook_timeout + delivery.ATTEMPT_MARGIN_SECONDS
    assert hard > timeout >= webhook_timeout + 55  # room for the DNS lookup, which it does not bound


@pytest.mark.parametrize("webhook_timeout", ["5", float("nan"), float("inf"), 0, -1])
def test_a_bad_webhook_timeout_leaves_the_default_attempt_limit(webhook_timeout):
    """Registered in ``ready()``: a value the settings check refuses must not stop the
    project from starting (``check`` reports it)."""
    assert delivery_limits(webhook_timeout)[0] == 60


def record(endpoint: WebhookEndpoint, days_ago: float, **fields: object) -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id=f"msg_{days_ago}",
        event="job.completed",
        job_id="8d6f3c52-4f0c-4b8e-9d0a-0c3f1f0a1b2c",
        created_at=timezone.now() - timedelta(days=days_ago),
        **fields,
    )


def test_prune_deletes_deliveries_older_than_the_retention_period(user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    old = [record(endpoint, days) for days in (31, 45, 400)]
    recent = [record(endpoint, days) for days in (29, 1, 0)]
    dry = prune(dry_run=True)  # RETENTION_DAYS: 30
    assert dry.deliveries == 3 and WebhookDelivery.objects.count() == 6
    report = prune(batch=2)
    assert report.deliveries == 3 and report.as_dict()["webhook_deliveries"] == 3
    assert sorted(WebhookDelivery.objects.values_list("pk", flat=True)) == sorted(r.pk for r in recent)
    assert not WebhookDelivery.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert "webhook_deliveries" not in prune().as_dict()  # nothing left to delete


def test_the_prune_command_deletes_old_deliveries_and_keeps_those_of_unfinished_deliveries(user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    job = services.enqueue("test.echo", {}, owner=user)
    retrying = outbox.queue_delivery(endpoint.pk, job.pk, "job.completed")  # still queued
    kept = record(endpoint, 40, delivery_job_id=retrying.pk)
    gone = record(endpoint, 40, delivery_job_id="0b7e5c1e-7a8f-4d4e-9a65-1f2d3c4b5a69")
    call_command("jobstate_prune", "--days", "30", stdout=io.StringIO())
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not WebhookDelivery.objects.filter(pk=gone.pk).exists()


@override_settings(JOBSTATE={"RETENTION_DAYS": None})
def test_without_retention_deliveries_are_kept(user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    record(endpoint, 4000)
    assert prune().deliveries == 0 and WebhookDelivery.objects.count() == 1


@override_settings(JOBSTATE={**ALLOW, "RETENTION_DAYS": 30})
def test_prune_keeps_a_job_until_the_deliveries_about_it_end(user, receiver):
    # The job went with the prune and its pending delivery ended "job deleted",
    # sending nothing: the message was lost without an error.
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    job = services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    (pending,) = Job.objects.filter(kind=outbox.KIND)  # queued, not yet sent (a worker is late)
    older = services.enqueue("test.echo", {})  # not announced: a batch of 1 goes on past the kept job
    drain(kinds=["test.echo"])
    Job.objects.filter(pk=older.pk).update(finished_at=timezone.now() - timedelta(days=50))
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=60))
    dry = prune(dry_run=True)
    report = prune(batch=1)
    assert (dry.jobs, report.jobs) == (1, 1) and Job.objects.filter(pk=job.pk).exists()
    assert not Job.objects.filter(pk=older.pk).exists()
    drain()
    assert Job.objects.get(pk=pending.pk).status == "completed" and len(receiver.requests) == 1
    assert prune().jobs == 1 and not Job.objects.filter(pk=job.pk).exists()  # delivered: it goes


def test_the_dry_run_keeps_the_parent_of_a_job_a_delivery_is_about(user):
    # The dry run left out the announced child but counted its parent, which the
    # prune keeps (it still has a child): 1 would go, 0 went.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    parent = services.enqueue("test.echo", {})
    child = services.enqueue("test.echo", {}, parent=parent)
    drain(kinds=["test.echo"])
    Job.objects.filter(pk__in=[parent.pk, child.pk]).update(finished_at=timezone.now() - timedelta(days=60))
    Job.objects.filter(kind=outbox.KIND).delete()  # none from the run itself: one queued below
    outbox.queue_delivery(endpoint.pk, child.pk, "job.completed")
    assert (prune(dry_run=True).jobs, prune().jobs) == (0, 0)
    assert Job.objects.filter(pk__in=[parent.pk, child.pk]).count() == 2


def _prune_reading(held: int, user) -> tuple[int, object]:
    # ``held`` old jobs that queued deliveries are about, one old job that may go.
    endpoint, _ = WebhookEndpoint.objects.get_or_create(owner=user, url="https://hooks.example.com/a")
    Job.objects.all().delete()
    jobs = [services.enqueue("test.echo", {}) for _ in range(held + 1)]
    drain(kinds=["test.echo"])
    for n, job in enumerate(jobs):  # the held ones the oldest: the batches read them first
        Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=90 - n))
    Job.objects.filter(kind=outbox.KIND).delete()
    for job in jobs[:-1]:
        outbox.queue_delivery(endpoint.pk, job.pk, "job.completed")
    with CaptureQueriesContext(connection) as queries:
        report = prune(batch=1, max_seconds=1e-9)
    assert (report.jobs, report.more) == (1, False) and not Job.objects.filter(pk=jobs[-1].pk).exists()
    assert Job.objects.filter(pk__in=[j.pk for j in jobs[:-1]]).count() == held
    return len(queries), report


def test_jobs_deliveries_are_about_cost_a_prune_nothing_batch_after_batch(user, settings, tmp_path):
    # Files other tests left in the media folder would leave the orphan sweep, which
    # the zero budget stops at once, with "more" to do.
    settings.MEDIA_ROOT = tmp_path
    # A batch made only of such jobs went round again without looking at the time
    # budget, and added them to a list every later batch sent back: with many
    # deliveries pending (an endpoint down) the prune ran past its budget, one
    # statement per batch of them, each longer than the last.
    few, _ = _prune_reading(1, user)
    many, _ = _prune_reading(6, user)
    assert many == few
    assert prune(dry_run=True).jobs == 0  # the dry run leaves them out too
