"""The process's cached "which events are wanted" (``jobstate.webhooks.cache``):
dropped by every write of jobstate's own that changes the endpoints, and never
filled from rows a rollback can undo. Committing tests: the answer is dropped
again when a change commits, and the test's own transaction would hide that."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import transaction
from django.test.utils import override_settings

from jobstate.webhooks import delivery, outbox
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.webhook_support import read_in_another_thread

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = frozenset({"job.started"})


@pytest.fixture(autouse=True)
def fresh_answers():
    outbox.forget()
    yield
    outbox.forget()


@pytest.fixture
def endpoint(user):
    return WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", events=["job.started"]
    )


class Undone(Exception):
    pass


def test_the_admins_bulk_delete_drops_the_answer(admin_client, endpoint):
    # Django's delete_selected deletes a queryset: the model's delete() is not called.
    assert outbox.wanted_events() == EVENTS
    response = admin_client.post(
        "/admin/jobstate/webhookendpoint/",
        {"action": "delete_selected", "_selected_action": [endpoint.pk], "post": "yes"},
    )
    assert response.status_code == 302 and not WebhookEndpoint.objects.exists()
    assert outbox.wanted_events() == frozenset()


@override_settings(JOBSTATE={"WEBHOOK_DISABLE_AFTER": 1})
def test_disabling_after_failures_drops_the_answer_again_when_it_commits(endpoint):
    # A queryset update: it dropped the answer at once only, and a thread that read the
    # endpoints before the disable committed had cached the enabled endpoint again.
    assert outbox.wanted_events() == EVENTS
    record = WebhookDelivery(endpoint=endpoint, webhook_id="msg_1", event="job.started", job_id=uuid.uuid4())
    with transaction.atomic():
        assert delivery._failed(record, endpoint, "HTTP 503", time.monotonic())
        assert read_in_another_thread() == EVENTS
    assert not WebhookEndpoint.objects.get(pk=endpoint.pk).enabled
    assert outbox.wanted_events() == frozenset()


def test_a_rolled_back_change_leaves_the_answer_of_the_committed_rows(endpoint):
    """A transaction that changed an endpoint read its own uncommitted rows and cached
    them for the whole process: rolled back, its deleted endpoint heard nothing for
    WEBHOOK_CACHE_SECONDS."""
    assert outbox.wanted_events() == EVENTS
    with pytest.raises(Undone), transaction.atomic():
        WebhookEndpoint.objects.get(pk=endpoint.pk).delete()
        assert outbox.wanted_events() == frozenset()  # its own change, as it reads it
        raise Undone
    assert outbox.wanted_events() == EVENTS
    with pytest.raises(Undone), transaction.atomic():
        WebhookEndpoint.objects.create(url="https://hooks.example.com/b", events=["job.failed"])
        assert outbox.wanted_events() == EVENTS | {"job.failed"}
        raise Undone
    assert outbox.wanted_events() == EVENTS


def test_a_change_rolled_back_to_a_savepoint_leaves_the_answer_of_the_transactions_rows(endpoint):
    with transaction.atomic():
        with pytest.raises(Undone), transaction.atomic():
            endpoint.enabled = False
            endpoint.save()
            assert outbox.wanted_events() == frozenset()
            raise Undone
        assert outbox.wanted_events() == EVENTS
    assert outbox.wanted_events() == EVENTS
