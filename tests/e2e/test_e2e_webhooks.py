"""A webhook delivery survives the SIGKILL of the worker process sending it:
the reaper takes the delivery job back and another worker sends the same
message (same webhook-id) again. Real qcluster, real local receiver."""

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
from tests.webhook_support import receiver  # noqa: F401  (fixture)

pytestmark = pytest.mark.e2e


def test_a_delivery_whose_worker_is_sigkilled_is_delivered_again_with_the_same_id(
    qcluster,
    receiver,  # noqa: F811
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
