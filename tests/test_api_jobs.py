"""REST API: enqueue, list (filters, ordering, keyset pages) and detail."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import override_settings
from django.utils import timezone

from jobstate import services
from jobstate.exceptions import UnknownKind
from jobstate.models import Job, JobEvent, JobStep
from jobstate.workflows import state
from tests.api_support import JOBS, assert_error, client_for, completed, grant, job_url, make_job, running

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int]:
    return Job.objects.count(), JobEvent.objects.count()


# Enqueue ----------------------------------------------------------------------


def test_enqueue_creates_a_job_owned_by_the_caller(user):
    response = client_for(user).post(JOBS, {"kind": "test.schema", "parameters": {"width": 3}}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert job.owner == user
    assert body["status"] == "queued"
    assert body["parameters"] == {"width": 3, "label": ""}  # cleaned by the handler's schema
    assert body["allowed_actions"] == ["cancel"]
    assert response["Location"].endswith(f"/api/jobs/{job.pk}/")
    event = JobEvent.objects.get(job=job)
    assert (event.actor_label, event.actor_id, event.transition) == ("api", user.pk, "enqueue")


@override_settings(JOBSTATE={"API_MAX_PRIORITY": 7})
def test_enqueue_with_options(user):
    when = timezone.now() + dt.timedelta(hours=1)
    response = client_for(user).post(
        JOBS,
        {"kind": "test.echo", "parameters": {}, "key": "k1", "priority": 7, "run_after": when.isoformat()},
        format="json",
    )
    assert response.status_code == 201
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.key, job.priority, job.run_after) == ("k1", 7, when)


def _priority_refused(client, priority, cap):  # type: ignore[no-untyped-def]
    before = counts()
    body = {"kind": "test.echo", "key": "k", "priority": priority}
    error = assert_error(client.post(JOBS, body, format="json"), 400, "invalid")
    message = (
        f"Ensure this value is less than or equal to {cap}: the highest priority you may set through the API."
    )
    assert error["fields"] == {"priority": [message]}
    assert error["message"] == f"priority: {message}"
    assert counts() == before


def _priority_taken(client, priority):  # type: ignore[no-untyped-def]
    response = client.post(JOBS, {"kind": "test.echo", "priority": priority}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).priority == priority


def test_a_caller_cannot_jump_the_queue_with_a_priority_above_the_cap(user):
    # Any user could send up to 32767, and their jobs ran before everyone else's.
    client = client_for(user)
    for priority in (1, 32767):
        _priority_refused(client, priority, 0)
    for priority in (0, -1, -32768):  # running later is always allowed, to the column's least
        _priority_taken(client, priority)
    assert_error(client.post(JOBS, {"kind": "test.echo", "priority": -32769}, format="json"), 400, "invalid")


def test_the_priority_cap_is_the_setting_read_at_each_request(user):
    client = client_for(user)
    with override_settings(JOBSTATE={"API_MAX_PRIORITY": 5}):
        _priority_taken(client, 5)
        _priority_refused(client, 6, 5)
    with override_settings(JOBSTATE={"API_MAX_PRIORITY": -10}):
        _priority_refused(client, 0, -10)  # the default priority too, when sent
        _priority_taken(client, -10)


def test_staff_holding_change_job_may_set_any_priority(user, staff_user):
    # Staff without the permission, and the permission without staff status, are capped.
    _priority_refused(client_for(grant(staff_user, "view_job", "requeue_job")), 1, 0)
    _priority_refused(client_for(grant(user, "change_job")), 1, 0)
    operator = client_for(grant(staff_user, "change_job"))
    for priority in (32767, 1, -32768):
        _priority_taken(operator, priority)


def test_the_priority_cap_binds_the_api_not_code(user):
    with override_settings(JOBSTATE={"API_MAX_PRIORITY": 0}):
        assert services.enqueue("test.echo", {}, owner=user, priority=32767).priority == 32767


def test_enqueue_with_a_known_key_returns_the_existing_job_with_200(user):
    client = client_for(user)
    first = client.post(JOBS, {"kind": "test.echo", "key": "daily", "watermark": 1}, format="json")
    second = client.post(JOBS, {"kind": "test.echo", "key": "daily", "watermark": 5}, format="json")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert second.json()["input_watermark"] == 5
    assert Job.objects.count() == 1
    # A replay answers as the 201 did (its Location) and says it is one, as Stripe does.
    assert second["Location"] == first["Location"]
    assert second["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first


def _reused(response, job, fields):  # type: ignore[no-untyped-def]
    error = assert_error(response, 422, "idempotency_key_reused")
    assert error["job_id"] == str(job.pk)
    assert set(error["fields"]) == set(fields)
    assert error["message"] == (
        f"Key '{job.key}' already names 'test.{job.kind.split('.')[1]}' job {job.pk}, which was enqueued "
        f"with other {' and '.join(fields)}: use a new key for new work."
    )
    return error


def test_a_key_reused_for_other_work_is_a_422_and_writes_nothing(user):
    # It answered 200 with the key's job: the request's parameters were dropped without a word.
    client = client_for(user)
    job = make_job(user, "test.schema", {"width": 3}, key="daily", watermark=1, priority=-2)
    before = counts()
    body = {"kind": "test.schema", "key": "daily", "watermark": 9, "priority": -2}
    error = _reused(
        client.post(JOBS, {**body, "parameters": {"width": 4}}, format="json"), job, ["parameters"]
    )
    assert error["fields"] == {"parameters": [f"Differs from job {job.pk}'s, which key 'daily' names."]}
    _reused(
        client.post(JOBS, {**body, "parameters": {"width": 3}, "priority": 0}, format="json"),
        job,
        ["priority"],
    )
    both = {**body, "parameters": {"width": 3, "label": "x"}, "priority": -3}
    _reused(client.post(JOBS, both, format="json"), job, ["parameters", "priority"])
    job.refresh_from_db()
    assert job.input_watermark == 1  # not raised: nothing is written
    assert counts() == before


def test_a_completed_jobs_key_reused_for_other_work_is_a_422(user):
    job = completed(user, key="nightly", watermark=3)
    before = counts()
    client = client_for(user)
    _reused(
        client.post(JOBS, {"kind": "test.echo", "key": "nightly", "parameters": {"n": 2}}, format="json"),
        job,
        ["parameters"],
    )
    assert counts() == before
    # A newer watermark is new work under the key: queued, whatever its parameters.
    newer = {"kind": "test.echo", "key": "nightly", "watermark": 4, "parameters": {"n": 2}}
    assert client.post(JOBS, newer, format="json").status_code == 201


def test_a_replay_is_the_same_work_however_it_is_spelt(user):
    # Compared after the kind's schema cleaned the request (defaults applied), as JSON:
    # key order and 1 vs 1.0 do not matter, true is not 1; run_after is not compared
    # (retries, requeues and re-runs move the job's own).
    client = client_for(user)
    schema = make_job(user, "test.schema", {"width": 3}, key="s")
    assert schema.parameters == {"width": 3, "label": ""}
    replay = client.post(
        JOBS, {"kind": "test.schema", "key": "s", "parameters": {"width": "3"}}, format="json"
    )
    assert (replay.status_code, replay.json()["id"]) == (200, str(schema.pk)), replay.content
    echo = make_job(user, parameters={"a": [1, {"b": None}], "c": "x", "big": 1e20}, key="e")
    later = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    again = {"kind": "test.echo", "key": "e", "run_after": later}
    same = {"c": "x", "big": 100000000000000000000, "a": [1.0, {"b": None}]}
    response = client.post(JOBS, {**again, "parameters": same}, format="json")
    assert (response.status_code, response.json()["id"]) == (200, str(echo.pk)), response.content
    for other in (
        {**same, "a": [True, {"b": None}]},
        {**same, "a": [1, {"b": None}, 2]},
        {**same, "c": None},
    ):
        _reused(client.post(JOBS, {**again, "parameters": other}, format="json"), echo, ["parameters"])


def test_a_replay_of_a_number_a_float_cannot_hold_exactly_is_the_same_work(user):
    # PostgreSQL's jsonb reads 1e23 back as the integer 10**23, which the float 1e23 (binary
    # 99999999999999991611392) is not equal to: a replay of it was a 422 there.
    client = client_for(user)
    for key, number in (("a", 1e23), ("b", 1.2345678901234567e19), ("c", 1.5e300)):
        request = {"kind": "test.echo", "key": key, "parameters": {"x": number}}
        first = client.post(JOBS, request, format="json")
        replay = client.post(JOBS, request, format="json")
        assert (first.status_code, replay.status_code) == (201, 200), replay.content
        assert replay.json()["id"] == first.json()["id"]
    # Numbers that differ still differ: 2**63 + 1 is not the float nearest it.
    job = make_job(user, parameters={"x": 2**63 + 1}, key="d")
    other = {"kind": "test.echo", "key": "d", "parameters": {"x": 9.223372036854775808e18}}
    _reused(client.post(JOBS, other, format="json"), job, ["parameters"])


def test_a_key_whose_job_is_being_cancelled_is_a_409_whatever_the_request(user):
    # Once it has ended the same request queues its work: a 409 to try again, not a 422.
    job = running(user, key="k")
    services.request_cancel(job, services.Actor.api(user))
    response = client_for(user).post(
        JOBS, {"kind": "test.echo", "key": "k", "parameters": {"n": 2}}, format="json"
    )
    assert_error(response, 409, "duplicate_active_key")


def test_code_still_gets_the_keys_job_whatever_it_was_enqueued_with(user):
    # The 422 is the API's rule: services.get_or_enqueue (django.tasks, the CLI) answers as before.
    job = make_job(user, key="k")
    assert services.get_or_enqueue("test.echo", {"n": 2}, owner=user, key="k", priority=5) == (job, False)


def test_an_enqueue_key_is_taken_as_sent_as_the_service_takes_it(user):
    # DRF stripped it: " daily " named the job that services.enqueue(key="daily") queued,
    # while the service keeps the two apart.
    client = client_for(user)
    plain = client.post(JOBS, {"kind": "test.echo", "key": "daily"}, format="json")
    spaced = client.post(JOBS, {"kind": "test.echo", "key": " daily "}, format="json")
    assert (plain.status_code, spaced.status_code) == (201, 201), spaced.content
    assert Job.objects.get(pk=spaced.json()["id"]).key == " daily "
    blank = client.post(JOBS, {"kind": "test.echo", "key": "  "}, format="json")
    assert blank.json()["error"]["fields"] == {"key": ["A key cannot be blank (only whitespace)."]}


@pytest.mark.parametrize("kind", [" test.echo", "test.echo ", "\ttest.echo\n", "   "])
def test_a_kind_is_taken_as_sent_as_the_registry_takes_it(user, kind):
    # DRF stripped it: " test.echo" queued a test.echo job, while services.enqueue and
    # `jobstate enqueue` look the name up as given (an unknown kind).
    before = counts()
    error = assert_error(client_for(user).post(JOBS, {"kind": kind}, format="json"), 400, "unknown_kind")
    assert error["fields"] == {"kind": [f"Unknown job kind '{kind}'."]}
    assert error["message"] == f"Unknown job kind '{kind}'."
    assert counts() == before
    with pytest.raises(UnknownKind):
        services.enqueue(kind, {})


def test_a_key_used_by_another_owner_queues_the_callers_own_job(user, other_user):
    # Keys are scoped per owner: the other owner's job is neither revealed nor touched.
    job = make_job(other_user, key="shared", watermark=1)
    jobs, events = counts()
    response = client_for(user).post(
        JOBS, {"kind": "test.echo", "key": "shared", "watermark": 9}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert str(job.pk) not in json.dumps(body)
    assert Job.objects.get(pk=body["id"]).owner == user
    job.refresh_from_db()
    assert job.input_watermark == 1  # the other owner's job was not touched
    assert counts() == (jobs + 1, events + 1)


def test_staff_enqueue_uses_the_staff_members_own_keys(user, staff_user):
    job = make_job(user, key="shared")
    response = client_for(staff_user).post(JOBS, {"kind": "test.echo", "key": "shared"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["id"] != str(job.pk)
    assert Job.objects.get(pk=response.json()["id"]).owner == staff_user


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"kind": "no.such.kind"}, "unknown_kind", "kind"),
        ({"parameters": {}}, "invalid", "kind"),
        ({"kind": 12}, "invalid", "kind"),
        ({"kind": "test.echo", "parameters": [1, 2]}, "invalid", "parameters"),
        ({"kind": "test.echo", "parameters": "x"}, "invalid", "parameters"),
        ({"kind": "test.echo", "priority": 99999}, "invalid", "priority"),
        ({"kind": "test.echo", "priority": "3"}, "invalid", "priority"),
        ({"kind": "test.echo", "priority": True}, "invalid", "priority"),
        ({"kind": "test.echo", "watermark": 2**63}, "invalid", "watermark"),
        ({"kind": "test.echo", "key": ""}, "invalid", "key"),
        ({"kind": "test.echo", "key": "   "}, "invalid", "key"),
        ({"kind": "test.echo", "key": "\t\n"}, "invalid", "key"),
        ({"kind": "test.echo", "key": "x" * 256}, "invalid", "key"),
        ({"kind": "test.echo", "key": "a\x00b"}, "invalid", "key"),
        ({"kind": "test.echo", "run_after": "yesterday"}, "invalid", "run_after"),
        ({"kind": "test.echo", "run_after": "0001-01-01T00:00:00+05:00"}, "invalid", "run_after"),
        ({"kind": "test.echo", "parameters": {"t": "nul\x00"}}, "invalid", "parameters"),
    ],
)
def test_bad_enqueue_input_is_a_400_naming_the_field_and_stores_nothing(user, body, code, field):
    before = counts()
    error = assert_error(client_for(user).post(JOBS, body, format="json"), 400, code)
    assert field in error["fields"], error
    assert counts() == before


UNKNOWN = ["Unknown field."]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        # Misspelt: the job was queued with the defaults and a 201, the typo never seen.
        ({"kind": "test.schema", "parmeters": {"width": 3}}, {"parmeters": UNKNOWN}),
        ({"kind": "test.echo", "max_atempts": 1}, {"max_atempts": UNKNOWN}),
        ({"kind": "test.echo", "run_afer": "2030-01-01T00:00:00Z"}, {"run_afer": UNKNOWN}),
        # Not an enqueue's, though a job shows it.
        (
            {"kind": "test.echo", "max_attempts": 1, "status": "completed"},
            {"max_attempts": UNKNOWN, "status": UNKNOWN},
        ),
        # Named first, with the other errors it explains.
        ({"knd": "test.echo"}, {"knd": UNKNOWN, "kind": ["This field is required."]}),
        (
            {"kind": "test.echo", "priority": "3", "x": 1},
            {"x": UNKNOWN, "priority": ["A valid integer is required."]},
        ),
    ],
)
def test_an_unknown_enqueue_field_is_a_400_naming_it_and_stores_nothing(user, body, fields):
    before = counts()
    error = assert_error(client_for(user).post(JOBS, body, format="json"), 400, "invalid")
    assert error["fields"] == fields
    name = next(iter(fields))
    assert error["message"] == f"{name}: {fields[name][0]}"
    assert counts() == before


def test_an_unknown_field_named_with_a_lone_surrogate_is_a_400_not_a_500(user):
    # The name is repeated in the error: as it came, the JSON renderer could not encode it.
    raw = '{"kind": "test.echo", "a\\ud800": 1}'
    error = assert_error(client_for(user).post(JOBS, raw, content_type="application/json"), 400, "invalid")
    assert error["fields"] == {"a\\ud800": UNKNOWN}
    assert not Job.objects.exists()


@pytest.mark.parametrize("use_tz", [True, False])
@pytest.mark.parametrize(
    ("zone", "when"), [("America/New_York", "9999-12-31T23:59:59"), ("Etc/GMT-14", "0001-01-01T00:00:00")]
)
def test_a_naive_run_after_past_the_calendars_edge_in_utc_is_a_400(user, settings, use_tz, zone, when):
    # Read in the current time zone, it is past year 9999 (or before year 1) in UTC: a 500.
    settings.USE_TZ, settings.TIME_ZONE = use_tz, zone
    response = client_for(user).post(JOBS, {"kind": "test.echo", "run_after": when}, format="json")
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"run_after": ["Datetime value out of range."]}
    assert counts() == (0, 0)


def test_with_use_tz_false_an_aware_run_after_is_stored_or_a_400_that_says_why(user, settings):
    # With USE_TZ = False, DRF made the time naive and the service refused it ("run_after
    # is a timezone-aware datetime."): no job could be deferred, on PostgreSQL too.
    settings.USE_TZ = False
    from django.db import connection

    when = "2030-01-01T12:00:00+00:00"
    response = client_for(user).post(JOBS, {"kind": "test.echo", "run_after": when}, format="json")
    if connection.features.supports_timezones:  # PostgreSQL stores it
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        aware = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
        assert job.run_after == timezone.make_naive(aware)  # in TIME_ZONE
        return
    error = assert_error(response, 400, "invalid")
    assert error["fields"]["run_after"][0].startswith("run_after cannot be stored with USE_TZ = False")
    assert counts() == (0, 0)


# With USE_TZ = False, Django stores naive times in TIME_ZONE: five hours behind UTC here.
NAIVE_IN_NEW_YORK = override_settings(USE_TZ=False, TIME_ZONE="America/New_York")


def _utc(naive: dt.datetime) -> str:
    """A stored (naive, TIME_ZONE) time as the API writes it."""
    return timezone.make_aware(naive).astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@NAIVE_IN_NEW_YORK
def test_with_use_tz_false_date_filters_compare_instants(user):
    # An aware value reached SQLite, which refused it (a 500); PostgreSQL compared it.
    old = make_job(user)
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(hours=3))
    new = make_job(user)
    client = client_for(user)

    def ids(**params: object) -> set[str]:
        response = client.get(JOBS, params)
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    for cut in (
        (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat(),
        (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2))
        .astimezone(dt.timezone(dt.timedelta(hours=9)))
        .isoformat(),
        (timezone.now() - dt.timedelta(hours=2)).isoformat(),  # naive: in TIME_ZONE
    ):
        assert ids(created_after=cut) == {str(new.pk)}, cut
        assert ids(created_before=cut) == {str(old.pk)}, cut
    assert_error(client.get(JOBS, {"created_after": "0001-01-01T00:00:00+05:00"}), 400, "invalid")


@NAIVE_IN_NEW_YORK
def test_with_use_tz_false_times_are_written_in_utc_and_pages_follow(user):
    # Written naive, in TIME_ZONE, with no offset to say so; the next page's cursor,
    # which holds such a time, was refused as invalid (a 400).
    first, second = make_job(user), make_job(user)
    client = client_for(user)
    ids, _pages = _walk(client, {"page_size": 1})
    assert ids == [str(second.pk), str(first.pk)]
    body = client.get(job_url(first)).json()
    first.refresh_from_db()
    assert body["created_at"] == _utc(first.created_at) and body["created_at"].endswith("Z")
    assert body["updated_at"] == _utc(first.updated_at)


@NAIVE_IN_NEW_YORK
@override_settings(JOBSTATE={"LONGPOLL_MAX_SECONDS": 3, "SSE_POLL_SECONDS": 0.05})
def test_with_use_tz_false_a_long_poll_reads_since_as_an_instant(user):
    # DRF made `since` naive in UTC, five hours off the stored updated_at: this poll
    # waited for its cap; one at the calendar's edge was a 500 (OverflowError).
    job = make_job(user)
    client = client_for(user)
    updated = _utc(Job.objects.values_list("updated_at", flat=True).get(pk=job.pk))
    before = (dt.datetime.fromisoformat(updated) - dt.timedelta(seconds=5)).isoformat()
    started = dt.datetime.now(dt.UTC)
    response = client.get(job_url(job), {"wait": 20, "since": before})
    assert response.status_code == 200 and response.json()["id"] == str(job.pk)
    assert (dt.datetime.now(dt.UTC) - started).total_seconds() < 2
    assert_error(client.get(job_url(job), {"wait": 1, "since": "0001-01-01T00:00:00+05:00"}), 400, "invalid")


@pytest.mark.parametrize(
    "raw",
    [b'{"kind": "test.echo", "parameters": {"t": "\\ud800"}}', b'{"kind": "test.echo", "key": "\\udfff"}'],
)
def test_lone_surrogates_are_a_400(user, raw):
    response = client_for(user).generic("POST", JOBS, raw, content_type="application/json")
    assert_error(response, 400, "invalid")
    assert Job.objects.count() == 0


def test_parameters_failing_the_handler_schema_give_field_errors(user):
    before = counts()
    response = client_for(user).post(
        JOBS, {"kind": "test.schema", "parameters": {"width": 0, "label": "x" * 60}}, format="json"
    )
    error = assert_error(response, 400, "invalid_parameters")
    assert set(error["fields"]["parameters"]) == {"width", "label"}
    assert "greater than or equal to 1" in error["fields"]["parameters"]["width"][0]
    assert error["message"].startswith("parameters.width: ")
    assert counts() == before


def test_parameters_over_the_size_limit_are_refused(user):
    with override_settings(JOBSTATE={"MAX_PARAMETERS_BYTES": 100}):
        response = client_for(user).post(
            JOBS, {"kind": "test.echo", "parameters": {"blob": "x" * 200}}, format="json"
        )
    error = assert_error(response, 400, "invalid")
    assert "limit is 100" in error["fields"]["parameters"][0]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("depth", [101, 900])
def test_parameters_nested_too_deep_are_a_400_and_store_nothing(user, depth):
    # Under runserver 950 levels passed the JSON parser, then hit Python's recursion
    # limit as the row was saved, deeper in the stack: a 500 before the depth limit.
    nested: object = 1
    for _ in range(depth - 1):
        nested = [nested]
    body = json.dumps({"kind": "test.echo", "parameters": {"a": "-"}}).replace('"-"', json.dumps(nested))
    response = client_for(user).post(JOBS, body, content_type="application/json")
    if depth > 200:  # refused by the parser, before any field is read
        error = assert_error(response, 400, "parse_error")
        assert "nested more than 200 levels deep" in error["message"]
    else:
        error = assert_error(response, 400, "invalid")
        assert "nested more than 100 levels deep" in error["fields"]["parameters"][0]
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


def test_parameters_nested_up_to_the_limit_are_stored(user):
    nested: object = {"x": "[{not a bracket}]"}
    for _ in range(98):
        nested = [nested]
    response = client_for(user).post(JOBS, {"kind": "test.echo", "parameters": {"a": nested}}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().parameters == {"a": nested}


def test_a_body_over_the_request_limit_is_a_413(user):
    with override_settings(JOBSTATE={"API_MAX_BODY_BYTES": 1000}):
        response = client_for(user).post(
            JOBS, {"kind": "test.echo", "parameters": {"blob": "x" * 5000}}, format="json"
        )
    assert_error(response, 413, "payload_too_large")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[" * 100_000,
        b'{"kind": NaN}',
        b"\xff\xfe",
        b'{"kind": "test.echo", "priority": 1e999}',
    ],
)
def test_malformed_json_is_a_400(user, raw):
    response = client_for(user).generic("POST", JOBS, raw, content_type="application/json")
    assert response.status_code == 400
    assert_error(response, 400)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"kind": "test.forbidden", "kind": "test.echo"}', "kind"),
        (b'{"kind": "test.echo", "parameters": {"n": {"a": 1, "a": 2}}}', "a"),
        (b'{"kind": "test.echo", "parameters": {"\\ud800": 1, "\\ud800": 2}}', "\\ud800"),
    ],
)
def test_a_name_given_twice_in_one_object_is_a_400_naming_it(user, raw, key):
    # The last one was taken silently: whatever read the first saw another request.
    response = client_for(user).generic("POST", JOBS, raw, content_type="application/json")
    error = assert_error(response, 400, "parse_error")
    assert error["message"] == f"JSON parse error - duplicate key {key!r}"
    assert Job.objects.count() == 0


def test_the_same_name_in_different_objects_is_fine(user):
    raw = b'{"kind": "test.echo", "parameters": {"kind": "x", "n": {"kind": "y"}}}'
    response = client_for(user).generic("POST", JOBS, raw, content_type="application/json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().parameters == {"kind": "x", "n": {"kind": "y"}}


def test_non_json_content_is_a_415(user):
    response = client_for(user).post(JOBS, "kind=test.echo", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")


# List -------------------------------------------------------------------------


def test_list_shows_only_the_callers_jobs_and_staff_with_view_job_see_all(user, other_user, staff_user):
    mine = {str(make_job(user).pk) for _ in range(3)}
    theirs = {str(make_job(other_user).pk) for _ in range(2)}
    ids = {j["id"] for j in client_for(user).get(JOBS).json()["results"]}
    assert ids == mine
    # Staff status alone is not enough, as in the admin.
    assert client_for(staff_user).get(JOBS).json()["results"] == []
    ids = {j["id"] for j in client_for(grant(staff_user, "view_job")).get(JOBS).json()["results"]}
    assert ids == mine | theirs


def test_list_filters(user):
    old = make_job(user, kind="test.schema", parameters={"width": 1})
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=3))
    keyed = make_job(user, key="abc")
    done = completed(user)
    busy = running(user)
    client = client_for(user)

    def ids(**params: object) -> set[str]:
        response = client.get(JOBS, params)
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    assert ids(status="completed") == {str(done.pk)}
    assert ids(status=["completed", "processing"]) == {str(done.pk), str(busy.pk)}
    assert ids(kind="test.schema") == {str(old.pk)}
    assert ids(key="abc") == {str(keyed.pk)}
    since = (timezone.now() - dt.timedelta(days=1)).isoformat()
    assert ids(created_after=since) == {str(keyed.pk), str(done.pk), str(busy.pk)}
    assert ids(created_before=since) == {str(old.pk)}
    assert ids(status="queued", kind="test.echo") == {str(keyed.pk)}


def test_key_and_kind_filters_match_as_sent_as_an_enqueue_stores_them(user):
    # The form field stripped them: ?key=%20daily%20 listed the "daily" job, not the
    # " daily " one, and ?key=%20 (no job can have a blank key) listed every job.
    plain = make_job(user, key="daily")
    spaced = make_job(user, key=" daily ")
    client = client_for(user)

    def ids(**params: object) -> list[str]:
        response = client.get(JOBS, params)
        assert response.status_code == 200, response.content
        return [j["id"] for j in response.json()["results"]]

    assert ids(key="daily") == [str(plain.pk)]
    assert ids(key=" daily ") == [str(spaced.pk)]
    assert ids(key="  ") == []
    assert ids(kind=" test.echo") == []
    assert ids(kind="test.echo", key=" daily ") == [str(spaced.pk)]


def test_list_filters_by_parent_and_retry_of(user):
    parent = make_job(user)
    child = make_job(user, parent=parent)
    first = completed(user)
    again = services.retry(first, services.Actor.api(user))
    client = client_for(user)
    assert [j["id"] for j in client.get(JOBS, {"parent": str(parent.pk)}).json()["results"]] == [
        str(child.pk)
    ]
    assert [j["id"] for j in client.get(JOBS, {"retry_of": str(first.pk)}).json()["results"]] == [
        str(again.pk)
    ]


@pytest.mark.parametrize(
    "params",
    [
        {"status": "sleeping"},
        {"created_after": "not a date"},
        {"parent": "nope"},
        {"ordering": "kind"},
        {"page_size": "0"},
        {"page_size": "501"},
        {"page_size": "ten"},
        {"cursor": "garbage"},
        {"cursor": "eyJvIjoiLWNyZWF0ZWRfYXQiLCJ2IjpbMSwyXX0"},  # {"o":"-created_at","v":[1,2]}
        {"kind": "a\x00b"},
        {"retry_of": ""},
        {"created_after": "0001-01-01T00:00:00+05:00"},
        {"created_after": ""},
        {"ordering": ""},
        {"page_size": ""},
        {"cursor": ""},
    ],
)
def test_bad_list_parameters_are_a_400(user, params):
    assert_error(client_for(user).get(JOBS, params), 400, "invalid")


@pytest.mark.parametrize(
    "values, message",
    [
        ([""], "'status' may not be empty."),
        (["queued", ""], "'status' may not be empty."),
        (
            ["sleeping"],
            "'sleeping' is not one of: queued, processing, waiting, completed, partial, failed, cancelled.",
        ),
    ],
)
def test_a_bad_status_filter_gets_one_clear_message(user, values, message):
    # An empty one had two: Django's ("Select a valid choice.  is not one of the available
    # choices.", the value left out) and the API's own.
    error = assert_error(client_for(user).get(JOBS, {"status": values}), 400, "invalid")
    assert error["fields"] == {"status": [message]}
    assert error["message"] == f"status: {message}"


@pytest.mark.parametrize(
    "param, value, message",
    [
        ("created_after", "yesterday", "Enter a valid date/time."),
        ("created_before", "x", "Enter a valid date/time."),
        ("created_after", "9999-12-31T23:59:59-05:00", "Date-time out of range."),
    ],
)
def test_a_bad_date_filter_is_reported_under_its_parameter(user, param, value, message):
    # They were reported under "created" (the range filter's form field), a name the
    # client never sent, against what rest-api.md promises.
    error = assert_error(client_for(user).get(JOBS, {param: value}), 400, "invalid")
    assert error["fields"] == {param: [message]}
    assert error["message"] == f"{param}: {message}"


@pytest.mark.parametrize("param", ["kind", "key", "parent", "retry_of", "created_after", "created_before"])
def test_a_single_valued_filter_given_twice_is_a_400(user, param):
    # ?kind=a&kind=b used only the last value, silently; status alone is repeatable.
    job = make_job(user, key="abc")
    value = {
        "kind": job.kind,
        "key": "abc",
        "parent": str(job.pk),
        "retry_of": str(job.pk),
        "created_after": (timezone.now() - dt.timedelta(days=1)).isoformat(),
        "created_before": (timezone.now() + dt.timedelta(days=1)).isoformat(),
    }[param]
    client = client_for(user)
    assert client.get(JOBS, {param: value}).status_code == 200
    error = assert_error(client.get(JOBS, {param: [value, value]}), 400, "invalid")
    assert error["fields"] == {param: [f"'{param}' may be given once."]}
    assert client.get(JOBS, {"status": ["queued", "failed"]}).status_code == 200


@pytest.mark.parametrize("param", ["ordering", "page_size", "cursor"])
def test_a_paging_parameter_given_twice_is_a_400_on_every_list(user, param):
    # ?page_size=5&page_size=500 used only the last value, silently, as the filters did.
    client = client_for(user)
    job = make_job(user)
    hook = client.post("/api/webhooks/", {"url": "https://hooks.example.com/a"}, format="json").data
    lists = {
        JOBS: "-created_at",
        job_url(job, "events/"): "id",
        job_url(job, "assets/"): "created_at",
        "/api/assets/": "-created_at",
        "/api/webhooks/": "-id",
        f"/api/webhooks/{hook['id']}/deliveries/": "-id",
    }
    for url, ordering in lists.items():
        value = {"ordering": ordering, "page_size": "1", "cursor": ""}[param]
        if param == "cursor":  # empty: the 400 of a malformed one (a real one below)
            assert_error(client.get(url, {param: value}), 400, "invalid")
        else:
            assert client.get(url, {param: value}).status_code == 200, url
        error = assert_error(client.get(url, {param: [value, value]}), 400, "invalid")
        assert error["fields"] == {param: [f"'{param}' may be given once."]}, url
    make_job(user)
    [cursor] = parse_qs(urlsplit(client.get(JOBS, {"page_size": 1}).data["next"]).query)["cursor"]
    assert client.get(JOBS, {"page_size": 1, "cursor": cursor}).status_code == 200
    assert_error(client.get(JOBS, {"page_size": 1, "cursor": [cursor, cursor]}), 400, "invalid")


@pytest.mark.parametrize("param, value", [("wait", "1"), ("since", "2026-01-01T00:00:00Z")])
def test_a_long_poll_parameter_given_twice_is_a_400(user, param, value):
    # ?wait=0&wait=30 used only the last value, silently, as the lists' parameters did.
    client = client_for(user)
    job = make_job(user)
    error = assert_error(client.get(job_url(job), {param: [value, value]}), 400, "invalid")
    assert error["fields"] == {param: [f"'{param}' may be given once."]}


@pytest.mark.parametrize("param", ["wait", "since"])
def test_an_empty_long_poll_parameter_is_a_400(user, param):
    # ?wait= answered at once, as if no wait was asked, while the lists refuse an empty value.
    client = client_for(user)
    job = make_job(user)
    error = assert_error(client.get(f"{job_url(job)}?{param}="), 400, "invalid")
    assert error["fields"] == {param: [f"'{param}' may not be empty."]}


@pytest.mark.parametrize(
    "value",
    ["9999-12-31T23:00:00-20:00", "0001-01-01T00:00:00+05:00", "2026-01-01T00:00:00+22:19"],
)
def test_a_cursor_date_out_of_range_or_odd_offset_is_a_400_or_normalised(user, value):
    # A crafted cursor: its date overflows when converted to UTC (400), or carries an
    # offset PostgreSQL refuses (sent as UTC instead).
    job = services.enqueue("test.echo", {}, owner=user)
    raw = json.dumps({"o": "-created_at", "v": [value, str(job.pk)]}).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = client_for(user).get(JOBS, {"cursor": cursor})
    if value.startswith("2026"):
        assert response.status_code == 200
    else:
        assert_error(response, 400, "invalid")


def test_odd_but_valid_dates_are_normalised_not_a_500(user):
    # PostgreSQL refuses offsets beyond ±15:59; the filter sends UTC.
    response = client_for(user).get(JOBS, {"created_before": "0489-02-28T15:48:30+22:19"})
    assert response.status_code == 200


def _walk(client, params: dict[str, object]) -> tuple[list[str], list[dict[str, object]]]:
    ids: list[str] = []
    pages = []
    url: str | None = JOBS
    first = True
    while url:
        response = client.get(url, params if first else None)
        first = False
        assert response.status_code == 200, response.content
        page = response.json()
        pages.append(page)
        ids += [j["id"] for j in page["results"]]
        url = page["next"]
    return ids, pages


@pytest.mark.parametrize("ordering", ["-created_at", "created_at", "-priority", "priority"])
def test_keyset_pages_cover_every_job_once_in_order_even_with_tied_timestamps(user, ordering):
    jobs = services.enqueue_many([("test.echo", {"i": i}) for i in range(9)], owner=user)  # one created_at
    for i, job in enumerate(jobs[:4]):
        Job.objects.filter(pk=job.pk).update(
            created_at=timezone.now() - dt.timedelta(minutes=i + 1), priority=i % 2
        )
    client = client_for(user)
    ids, pages = _walk(client, {"page_size": 2, "ordering": ordering})
    assert len(ids) == len(set(ids)) == 9
    field = ordering.lstrip("-")
    rows = {str(j.pk): j for j in Job.objects.all()}
    key = [(getattr(rows[i], field), rows[i].created_at, rows[i].pk) for i in ids]
    expected = sorted(key, reverse=ordering.startswith("-"))
    if field == "created_at":
        expected = sorted(key, key=lambda k: (k[0], k[2]), reverse=ordering.startswith("-"))
    assert key == expected
    assert pages[0]["previous"] is None and pages[-1]["next"] is None

    # Walking back with `previous` from the last page gives the same pages.
    back: list[str] = []
    url = pages[-1]["previous"]
    while url:
        page = client.get(url).json()
        back = [j["id"] for j in page["results"]] + back
        url = page["previous"]
    assert back + [j["id"] for j in pages[-1]["results"]] == ids


def test_a_cursor_does_not_mix_orderings(user):
    for _ in range(3):
        make_job(user)
    client = client_for(user)
    next_url = client.get(JOBS, {"page_size": 1}).json()["next"]
    assert_error(client.get(next_url + "&ordering=priority"), 400, "invalid")


def test_list_items_are_light_and_carry_allowed_actions(user):
    make_job(user, parameters={"big": "x" * 1000})
    item = client_for(user).get(JOBS).json()["results"][0]
    assert "parameters" not in item and "result" not in item and "traceback" not in item
    assert item["owner"] == "alice"
    assert item["allowed_actions"] == ["cancel"]


def test_list_query_count_does_not_grow_with_the_page(user, django_assert_num_queries):
    client = client_for(user)
    for _ in range(3):
        make_job(user)
    with django_assert_num_queries(2):  # token + user, then the page (owner joined)
        assert client.get(JOBS).status_code == 200
    for _ in range(30):
        completed(user)
    with django_assert_num_queries(2):
        response = client.get(JOBS, {"status": ["completed", "queued"], "kind": "test.echo"})
    assert len(response.json()["results"]) == 33


def test_staff_list_query_count(staff_user, user, other_user, django_assert_max_num_queries):
    for owner in (user, other_user) * 10:
        completed(owner)
    client = client_for(grant(staff_user, "view_job"))
    # token + user, the page, and the staff user's permissions once (user, group)
    with django_assert_max_num_queries(4):
        response = client.get(JOBS)
    assert len(response.json()["results"]) == 20


# Detail -----------------------------------------------------------------------


def test_no_answer_shows_a_running_jobs_lease_token(user, staff_user):
    # The token is the worker's credential for every write to the job: neither its owner
    # nor staff who may view all jobs ever see it (nor any part of it).
    job = running(user)
    token = job.lease_token
    assert token is not None
    for client in (client_for(user), client_for(grant(staff_user, "view_job"))):
        for url in (JOBS, job_url(job), job_url(job) + "?wait=0.01", job_url(job, "events/")):
            response = client.get(url)
            assert response.status_code == 200, url
            text = response.content.decode()
            assert str(token)[:8] not in text and token.hex[-8:] not in text, url


def test_detail_shows_state_progress_steps_and_actions(user):
    job = running(user)
    services.report_progress(job, job.lease_token, 40, "halfway-ish", step="resize")
    JobStep.objects.create(
        job=job, position=0, name="fetch", status="completed", cursor={"page": 3}, finished_at=timezone.now()
    )
    JobStep.objects.create(job=job, position=1, name="resize", status="running", output={"n": 2})
    body = client_for(user).get(job_url(job)).json()
    assert body["status"] == "processing"
    assert (body["progress"], body["progress_message"], body["current_step"]) == (40, "halfway-ish", "resize")
    assert [s["name"] for s in body["steps"]] == ["fetch", "resize"]
    assert body["steps"][0]["cursor"] == {"page": 3}
    assert body["steps"][1]["output"] == {"n": 2}
    assert (body["attempts"], body["max_attempts"]) == (1, 3)
    assert body["started_at"] and body["finished_at"] is None
    assert body["allowed_actions"] == ["cancel"]
    assert body["parameters"] == {"n": 1}


@pytest.mark.parametrize("stored", ["running", "serving", "waiting"])
def test_a_step_in_progress_when_its_job_ended_is_interrupted_as_in_state(user, stored):
    """The API showed it running in a failed job (state(job) said interrupted)."""
    job = running(user)
    JobStep.objects.create(job=job, position=0, name="s1", status="completed", finished_at=timezone.now())
    JobStep.objects.create(job=job, position=1, name="s2", status=stored)
    client = client_for(user)
    live = client.get(job_url(job)).json()["steps"]
    assert [(s["status"], s["stored_status"]) for s in live] == [("completed", None), (stored, None)]
    services.fail(job, job.lease_token, "boom", retry=False)
    steps = client.get(job_url(job)).json()["steps"]
    assert [(s["status"], s["stored_status"]) for s in steps] == [
        ("completed", None),
        ("interrupted", stored),
    ]
    shown = [(s["status"], s.get("stored_status")) for s in state(job.pk)["steps"]]
    assert shown == [(s["status"], s["stored_status"]) for s in steps]
    assert JobStep.objects.get(job=job, name="s2").status == stored  # read-side: nothing written


def test_detail_of_a_finished_job(user):
    job = completed(user, result={"rows": 10})
    body = client_for(user).get(job_url(job)).json()
    assert (body["status"], body["progress"], body["result"]) == ("completed", 100, {"rows": 10})
    assert body["allowed_actions"] == ["retry"]
    assert body["finished_at"] and body["duration"] is not None


def test_detail_query_count(user, django_assert_num_queries):
    job = running(user)
    for i in range(5):
        JobStep.objects.create(job=job, position=i, name=f"s{i}")
    client = client_for(user)
    with django_assert_num_queries(3):  # token + user, job + owner, steps
        response = client.get(job_url(job))
    assert len(response.json()["steps"]) == 5


@pytest.mark.parametrize("pk", ["not-a-uuid", "12345", "6f1c2a3e-0000-4000-8000-000000000000", "a.b"])
def test_unknown_or_malformed_ids_are_a_json_404(user, pk):
    assert_error(client_for(user).get(f"{JOBS}{pk}/"), 404, "not_found")


def test_long_poll_returns_at_once_when_the_job_already_changed(user):
    job = make_job(user)
    long_ago = (job.updated_at - dt.timedelta(seconds=5)).isoformat()
    response = client_for(user).get(job_url(job), {"wait": 20, "since": long_ago})
    assert response.status_code == 200 and response.json()["id"] == str(job.pk)


@override_settings(JOBSTATE={"LONGPOLL_MAX_SECONDS": 3, "SSE_POLL_SECONDS": 0.05})
def test_long_poll_returns_at_once_when_the_job_changed_before_since(user):
    # After the server's clock stepped back a change is earlier than the updated_at the client
    # has: the poll waited for `updated_at > since`, its whole wait.
    job = running(user)
    client = client_for(user)
    since = client.get(job_url(job)).json()["updated_at"]
    stepped_back = dt.datetime.fromisoformat(since) - dt.timedelta(hours=1)
    services.report_progress(job, job.lease_token, 40, "resizing", now=stepped_back)
    started = time.monotonic()
    response = client.get(job_url(job), {"wait": 20, "since": since})
    assert response.status_code == 200 and response.json()["progress"] == 40
    assert time.monotonic() - started < 2


@override_settings(JOBSTATE={"LONGPOLL_MAX_SECONDS": 0.3, "SSE_POLL_SECONDS": 0.05})
def test_long_poll_is_capped_by_the_server(user):
    job = make_job(user)
    started = timezone.now()
    response = client_for(user).get(job_url(job), {"wait": 300})
    elapsed = (timezone.now() - started).total_seconds()
    assert response.status_code == 200
    assert 0.25 <= elapsed < 5


@pytest.mark.django_db(transaction=True)
@override_settings(JOBSTATE={"LONGPOLL_MAX_SECONDS": 0.5, "SSE_POLL_SECONDS": 0.05})
def test_a_long_poll_under_wsgi_keeps_its_connection_between_polls(user, monkeypatch):
    # Closing after each poll is for ASGI, where the request's thread and connection are
    # otherwise held idle; under WSGI the thread is held anyway.
    from django.db.backends.base.base import BaseDatabaseWrapper

    closes: list[int] = []
    real = BaseDatabaseWrapper.close
    monkeypatch.setattr(BaseDatabaseWrapper, "close", lambda self: (closes.append(1), real(self))[1])
    job = make_job(user)
    response = client_for(user).get(job_url(job), {"wait": 300})
    assert response.status_code == 200
    assert len(closes) <= 2, closes  # the request's start and end (CONN_MAX_AGE=0), not each of ~10 polls


def test_long_poll_validates_its_parameters(user):
    job = make_job(user)
    client = client_for(user)
    assert_error(client.get(job_url(job), {"wait": -1}), 400, "invalid")
    assert_error(client.get(job_url(job), {"wait": 1, "since": "soon"}), 400, "invalid")
    assert_error(client.get(job_url(job), {"wait": 1, "since": "0001-01-01T00:00:00+05:00"}), 400, "invalid")


@override_settings(TIME_ZONE="Asia/Kolkata")
def test_times_are_utc_iso_8601(user):
    job = make_job(user)
    body = client_for(user).get(job_url(job)).json()
    assert body["created_at"].endswith("Z")
    assert dt.datetime.fromisoformat(body["created_at"]) == job.created_at


def test_a_child_under_a_cancelling_parent_is_not_retried(user):
    parent = services.enqueue("test.echo", {}, owner=user)
    services.start(parent, "w")
    child = services.enqueue("test.echo", {}, owner=user, parent=parent, max_attempts=1)
    services.request_cancel(child, "ops", "stop")  # queued: cancelled at once
    services.request_cancel(parent, "ops", "stop")
    response = client_for(user).post(f"{job_url(child)}retry/", {}, format="json")
    assert_error(response, 409, "parent_ended")
    assert "being cancelled" in response.json()["error"]["message"]
    assert not Job.objects.filter(retry_of=child.pk).exists()
