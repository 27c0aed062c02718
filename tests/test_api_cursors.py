"""REST API: a keyset cursor holds each sort value as the JSON type the API writes it
(a string for a time or an id, an integer for a number); any other type is refused
with the 400 every invalid cursor gets, not coerced (``5`` into a UUID, ``"5"``,
``5.5`` or ``true`` into a priority)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from django.db.models import IntegerField

from jobstate.api.pagination import (
    AssetPagination,
    EventPagination,
    JobAssetPagination,
    JobPagination,
    KeysetPagination,
)
from jobstate.api.webhooks import NewestFirst
from jobstate.models import Asset, Job, JobEvent
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.api_support import JOBS, assert_error, client_for, make_job

pytestmark = pytest.mark.django_db

LISTS: list[tuple[str, type[KeysetPagination], Any]] = [
    (JOBS, JobPagination, Job),
    ("/api/jobs/{job}/events/", EventPagination, JobEvent),
    ("/api/assets/", AssetPagination, Asset),
    ("/api/jobs/{job}/assets/", JobAssetPagination, Asset),
    ("/api/webhooks/", NewestFirst, WebhookEndpoint),
    ("/api/webhooks/{hook}/deliveries/", NewestFirst, WebhookDelivery),
]
CASES = [
    (url, ordering, model, fields)
    for url, pagination, model in LISTS
    for ordering, fields in pagination.orderings.items()
]

# One value of every JSON type; the right one for a field is left out.
WRONG: dict[type, list[Any]] = {
    str: [5, 0, 5.5, True, False, None, [], ["x"], {}, {"v": "x"}],
    int: ["5", "0", 5.5, 5.0, True, False, None, [], [5], {}, {"v": 5}],
}


def good_value(model: Any, name: str) -> Any:
    field = model._meta.get_field(name.lstrip("-"))
    if isinstance(field, IntegerField):
        return 1
    if field.get_internal_type() == "UUIDField":
        return str(uuid.uuid4())
    return "2026-01-01T00:00:00+00:00"


def cursor(ordering: str, values: list[Any]) -> str:
    raw = json.dumps({"o": ordering, "v": values}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "url, ordering, model, fields", CASES, ids=[f"{url}?ordering={ordering}" for url, ordering, _, _ in CASES]
)
def test_a_cursor_value_of_the_wrong_json_type_is_a_400(
    user: Any, url: str, ordering: str, model: Any, fields: Any
) -> None:
    hook = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    url = url.format(job=make_job(user).pk, hook=hook.pk)
    client = client_for(user)
    good = [good_value(model, name) for name in fields]
    assert client.get(url, {"ordering": ordering, "cursor": cursor(ordering, good)}).status_code == 200
    for i, name in enumerate(fields):
        field = model._meta.get_field(name.lstrip("-"))
        for wrong in WRONG[int if isinstance(field, IntegerField) else str]:
            values = [*good[:i], wrong, *good[i + 1 :]]
            response = client.get(url, {"ordering": ordering, "cursor": cursor(ordering, values)})
            error = assert_error(response, 400, "invalid")
            assert error["fields"] == {"cursor": ["Invalid cursor."]}, (name, wrong)
