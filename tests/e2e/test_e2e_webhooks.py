"""Webhooks under a real qcluster with a real local receiver: a delivery
survives the SIGKILL of the worker process sending it (the reaper takes the
delivery job back and another worker sends the same message, same webhook-id,
again); a 500 is retried after a backoff under the same webhook-id; and nothing
reaches 127.0.0.1 unless WEBHOOK_ALLOW_PRIVATE says so."""

from __future__ import annotations

import signal

import pytest
from standardwebhooks.webhooks import Webhook

from jobstate import services
from jobstate.models import Job
from jobstate.states import Status
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobstate.webhooks.outbox import KIND
from tests.e2e.support import wait_for, worker_pid
from tests.webhook_support import Receiver

pytestmark = pytest.mark.e2e


def test_a_delivery_whose_worker_is_sigkilled_is_delivered_again_with_the_same_id(
    qcluster,
    receiver,
    django_user_model,
):
    user = django_user_model.objects.create_user("dora", password="pw-dora-123")
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.holds = 1  # the first request hangs: the worker is mid-delivery
    cluster = qcluster(workers=2, jobstate={"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_TIMEOUT": 60})
    job = services.enqueue("test.echo", {"n": 1}, owner=user)

    wait_for(lambda: len(receiver.requests) == 1, 20, message="the first delivery attempt")
    delivery = Job.objects.get(kind=KIND)
    assert delivery.status == Status.PROCESSING
    victim = worker_pid(delivery.worker_id)
    cluster.kill(victim, signal.SIGKILL)

    wait_for(lambda: len(receiver.requests) >= 2, 30, message=cluster.log()[-3000:])
    wait_for(lambda: Job.objects.get(pk=delivery.pk).status in (Status.COMPLETED, Status.FAILED), 20)
    first, second = receiver.requests[:2]
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    message = Webhook(endpoint.secret).verify(second.body, second.headers)
    assert message["type"] == "job.completed" and message["data"]["id"] == str(job.pk)
    done = Job.objects.get(pk=delivery.pk)
    assert done.status == Status.COMPLETED and done.attempts == 2
    assert list(done.events.values_list("transition", flat=True)) == [
        "enqueue",
        "claim",
        "requeue",
        "claim",
        "complete",
    ]
    assert done.events.get(transition="requeue").actor_label == "system:reaper"
    # Only the second attempt got an answer to record.
    assert list(WebhookDelivery.objects.values_list("attempt", "ok", "status_code")) == [(2, True, 200)]


def finished(job: Job) -> bool:
    return Job.objects.get(pk=job.pk).status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


def test_a_500_is_retried_after_a_backoff_with_the_same_webhook_id(
    qcluster,
    receiver,
    django_user_model,
):
    user = django_user_model.objects.create_user("dora", password="pw-dora-123")
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.statuses = [500]
    qcluster(workers=2, jobstate={"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_BACKOFF_BASE": 0.5})
    job = services.enqueue("test.echo", {"n": 2}, owner=user)

    wait_for(lambda: len(receiver.requests) >= 2, 20, message="a second delivery attempt")
    delivery = Job.objects.get(kind=KIND)
    wait_for(lambda: finished(delivery), 20, message="the delivery to end")
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert second.at - first.at >= 0.5  # the backoff: 0.5 s and up to 25 % jitter
    message = Webhook(endpoint.secret).verify(second.body, second.headers)
    assert message["type"] == "job.completed" and message["data"]["id"] == str(job.pk)
    assert message["data"]["result"] == {"echo": {"n": 2}}
    done = Job.objects.get(pk=delivery.pk)
    assert done.status == Status.COMPLETED and done.attempts == 2
    assert done.result["status_code"] == 200
    rows = WebhookDelivery.objects.order_by("id").values_list("attempt", "ok", "status_code", "error")
    assert list(rows) == [(1, False, 500, "HTTP 500"), (2, True, 200, "")]
    assert set(WebhookDelivery.objects.values_list("webhook_id", flat=True)) == {first.headers["webhook-id"]}
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.consecutive_failures == 0


@pytest.mark.parametrize("allowed", [False, True], ids=["default-settings", "allow-private"])
def test_nothing_reaches_loopback_unless_private_addresses_are_allowed(
    qcluster,
    receiver: Receiver,
    django_user_model,
    allowed,
):
    user = django_user_model.objects.create_user("dora", password="pw-dora-123")
    # Made through the ORM: the API refuses a literal private address outright.
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    qcluster(workers=2, jobstate={"WEBHOOK_ALLOW_PRIVATE": True} if allowed else {})
    job = services.enqueue("test.echo", {"n": 3}, owner=user)

    wait_for(lambda: Job.objects.filter(kind=KIND).exists(), 20, message="the delivery to be queued")
    delivery = Job.objects.get(kind=KIND)
    wait_for(lambda: finished(delivery), 20, message="the delivery to end")
    delivery.refresh_from_db()
    (row,) = WebhookDelivery.objects.all()
    assert row.attempt == 1 and delivery.attempts == 1
    if not allowed:
        assert receiver.requests == []
        assert delivery.status == Status.FAILED  # refused at once, not retried
        assert "127.0.0.1 resolves to a non-public address" in delivery.error_message
        assert not row.ok and row.status_code is None and "WEBHOOK_ALLOW_PRIVATE" in row.error
        return
    (request,) = receiver.requests
    message = Webhook(endpoint.secret).verify(request.body, request.headers)
    assert message["type"] == "job.completed" and message["data"]["id"] == str(job.pk)
    assert delivery.status == Status.COMPLETED
    assert (row.ok, row.status_code, row.webhook_id) == (True, 200, request.headers["webhook-id"])
