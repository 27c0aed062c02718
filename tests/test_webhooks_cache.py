"""The process's cached "which events are wanted" (``jobstate.webhooks.cache``):
dropped by every write of jobstate's own that changes the endpoints. Committing
tests: the answer is dropped again when a change commits, and the test's own
transaction would hide that."""

from __future__ import annotations

import pytest

from jobstate.webhooks import outbox
from jobstate.webhooks.models import WebhookEndpoint

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


def test_the_admins_bulk_delete_drops_the_answer(admin_client, endpoint):
    # Django's delete_selected deletes a queryset: the model's delete() is not called.
    assert outbox.wanted_events() == EVENTS
    response = admin_client.post(
        "/admin/jobstate/webhookendpoint/",
        {"action": "delete_selected", "_selected_action": [endpoint.pk], "post": "yes"},
    )
    assert response.status_code == 302 and not WebhookEndpoint.objects.exists()
    assert outbox.wanted_events() == frozenset()
