"""REST API: a keyset cursor holds each sort value as the JSON type the API writes it
(a string for a time or an id, an integer for a number); any other type is refused
with the 400 every invalid cursor gets, not coerced (``5`` into a UUID, ``"5"``,
``5.5`` or ``true`` into a priority), and so is a value no row can hold (a number
past its column's range, a time past the calendar, an id that is not a UUID)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from django.db.models import IntegerField
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

# The columns' ranges as PostgreSQL types them, on every database.
INT_RANGES = {
    "SmallIntegerField": (-(2**15), 2**15 - 1),
    "BigAutoField": (-(2**63), 2**63 - 1),
}

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


@pytest.mark.parametrize("url", [url for url, _, _ in LISTS])
def test_an_empty_cursor_is_the_400_of_a_malformed_one(user: Any, url: str) -> None:
    # It gave the first page, where an empty ordering or page_size is a 400.
    hook = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    url = url.format(job=make_job(user).pk, hook=hook.pk)
    client = client_for(user)
    malformed = assert_error(client.get(url, {"cursor": "garbage"}), 400, "invalid")
    assert assert_error(client.get(url, {"cursor": ""}), 400, "invalid") == malformed
    assert malformed["fields"] == {"cursor": ["Invalid cursor."]}


# Values no row holds, for each kind of field; the integers come from INT_RANGES.
OUT_OF_RANGE: dict[str, list[Any]] = {
    "DateTimeField": [
        "99999-01-01T00:00:00+00:00",
        "+99999-01-01T00:00:00+00:00",
        "0000-01-01T00:00:00+00:00",
        "9999-12-31T23:59:59-15:00",  # past the year 9999 in UTC
        "0001-01-01T00:00:00+15:00",
        "2026-01-01T24:00:01+00:00",
        "2026-02-30T00:00:00+00:00",
    ],
    "UUIDField": [
        "not-a-uuid",
        "",
        "01a22a71-2164-730f-bdeb-7ca0559ba1b",
        "01a22a71-2164-730f-bdeb-7ca0559ba1b3f",
    ],
}


def out_of_range(model: Any, name: str) -> list[Any]:
    kind = model._meta.get_field(name.lstrip("-")).get_internal_type()
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        return [high + 1, low - 1, 10**30, -(10**30)]
    return OUT_OF_RANGE[kind]


def list_url(url: str, user: Any) -> str:
    hook = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    return url.format(job=make_job(user).pk, hook=hook.pk)


@pytest.mark.parametrize(
    "url, ordering, model, fields", CASES, ids=[f"{url}?ordering={ordering}" for url, ordering, _, _ in CASES]
)
def test_a_cursor_value_out_of_its_columns_range_is_a_400(
    user: Any, url: str, ordering: str, model: Any, fields: Any
) -> None:
    """Django turned a lookup past an integer column's range into an empty (or full)
    page, so a forged priority of 10**30 or 40000 answered a 200."""
    url = list_url(url, user)
    client = client_for(user)
    good = [good_value(model, name) for name in fields]
    for i, name in enumerate(fields):
        kind = model._meta.get_field(name.lstrip("-")).get_internal_type()
        for edge in INT_RANGES.get(kind, ()):  # the range's own ends are values a row may hold
            values = [*good[:i], edge, *good[i + 1 :]]
            response = client.get(url, {"ordering": ordering, "cursor": cursor(ordering, values)})
            assert response.status_code == 200, (name, edge)
        for bad in out_of_range(model, name):
            values = [*good[:i], bad, *good[i + 1 :]]
            response = client.get(url, {"ordering": ordering, "cursor": cursor(ordering, values)})
            error = assert_error(response, 400, "invalid")
            assert error["fields"] == {"cursor": ["Invalid cursor."]}, (name, bad)


FORGED = [case for case in CASES if case[:2] in {(JOBS, "-priority"), ("/api/jobs/{job}/events/", "id")}]


@pytest.mark.parametrize("url, ordering, model, fields", FORGED, ids=["-priority", "events"])
def test_a_forged_cursor_is_a_page_or_a_400_never_a_500(
    user: Any, url: str, ordering: str, model: Any, fields: Any
) -> None:
    url = list_url(url, user)
    client = client_for(user)
    good = [good_value(model, name) for name in fields]
    kinds = [model._meta.get_field(name.lstrip("-")).get_internal_type() for name in fields]

    numbers = st.one_of(st.integers(-(2**16), 2**16), st.integers(-(2**64), 2**64), st.integers())
    texts = st.one_of(
        st.text(max_size=40), st.datetimes().map(lambda t: f"{t.isoformat()}+00:00"), st.uuids().map(str)
    )

    @given(i=st.integers(0, len(fields) - 1), number=numbers, text=texts)
    @settings(
        max_examples=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(i: int, number: int, text: str) -> None:
        value: Any = number if kinds[i] in INT_RANGES else text
        values = [*good[:i], value, *good[i + 1 :]]
        response = client.get(url, {"ordering": ordering, "cursor": cursor(ordering, values)})
        if kinds[i] in INT_RANGES:
            low, high = INT_RANGES[kinds[i]]
            assert response.status_code == (200 if low <= number <= high else 400), number
        else:
            assert response.status_code in (200, 400), text

    run()
