"""/api/webhooks/: owner-scoped endpoints, global ones for staff, rotation,
deliveries and re-enabling; and the admin pages."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from jobstate.api import webhooks as webhooks_api
from jobstate.models import Job
from jobstate.webhooks import outbox, rotation
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.api_support import assert_error, client_for, grant, job_url, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

URL = "/api/webhooks/"


@pytest.fixture(autouse=True)
def fresh_answers():
    outbox.forget()
    yield
    outbox.forget()


def test_an_owner_creates_lists_and_sees_only_their_endpoints(user, other_user):
    alice, bob = client_for(user), client_for(other_user)
    response = alice.post(URL, {"url": "https://hooks.example.com/a"}, format="json")
    assert response.status_code == 201, response.data
    data = response.data
    assert data["owner"] == "alice" and data["is_global"] is False and data["enabled"] is True
    assert data["secret"].startswith("whsec_") and data["events"] == [
        "job.completed",
        "job.failed",
        "job.cancelled",
        "job.partial",
    ]
    assert WebhookEndpoint.objects.get().owner == user
    assert [e["id"] for e in alice.get(URL).data["results"]] == [data["id"]]
    assert bob.get(URL).data["results"] == []
    assert bob.get(f"{URL}{data['id']}/").status_code == 404
    assert bob.delete(f"{URL}{data['id']}/").status_code == 404
    assert client_for(None).get(URL).status_code == 401


def test_create_answers_the_new_endpoints_own_url_as_location(user):
    # DRF's default Location is the body's "url": the address deliveries go to.
    client = client_for(user)
    response = client.post(URL, {"url": "https://hooks.example.com/a"}, format="json")
    assert response.status_code == 201
    location = response["Location"]
    assert location == f"http://testserver{URL}{response.data['id']}/"
    assert client.get(location).json()["url"] == "https://hooks.example.com/a"


def test_events_are_checked(user):
    response = client_for(user).post(
        URL, {"url": "https://hooks.example.com/a", "events": ["job.exploded"]}, format="json"
    )
    assert response.status_code == 400 and "events" in response.data["error"]["fields"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/x",
        "http://[::1]/x",
        "http://10.0.0.8/",
        "http://[fec0::1]/",  # site-local
        "ftp://a.b/",
        # Credentials were accepted, shown in the API and the admin, and never sent.
        "https://user:secret@hooks.example.com/a",
        "https://user@hooks.example.com/a",
    ],
)
def test_private_and_odd_urls_are_refused(user, url):
    response = client_for(user).post(URL, {"url": url}, format="json")
    assert response.status_code == 400 and "url" in response.data["error"]["fields"]


@override_settings(JOBSTATE={"WEBHOOK_ALLOW_PRIVATE": True})
def test_private_urls_pass_when_allowed(user):
    assert client_for(user).post(URL, {"url": "http://127.0.0.1:8000/x"}, format="json").status_code == 201


def test_only_staff_with_view_job_create_global_endpoints(user, staff_user):
    body = {"url": "https://hooks.example.com/all", "is_global": True}
    assert client_for(user).post(URL, body, format="json").status_code == 403
    viewer = grant(staff_user, "view_job")
    response = client_for(viewer).post(URL, body, format="json")
    assert response.status_code == 201 and response.data["is_global"] is True
    assert WebhookEndpoint.objects.get().owner is None
    # Staff with jobstate.view_job see everyone's endpoints, as with jobs.
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    assert len(client_for(viewer).get(URL).data["results"]) == 2
    assert len(client_for(user).get(URL).data["results"]) == 1


def test_a_full_update_that_leaves_out_is_global_keeps_it(user, staff_user):
    # Its default (false) applied to a PUT: the global endpoint became its editor's own.
    viewer = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    made = viewer.post(URL, {"url": "https://hooks.example.com/all", "is_global": True}, format="json")
    body = {"url": "https://hooks.example.com/all-v2", "events": ["job.failed"]}
    put = viewer.put(f"{URL}{made.data['id']}/", body, format="json")
    assert put.status_code == 200 and put.data["is_global"] is True
    assert WebhookEndpoint.objects.get(pk=made.data["id"]).owner is None
    mine = client_for(user).post(URL, {"url": "https://hooks.example.com/a"}, format="json")
    assert mine.data["is_global"] is False and mine.data["owner"] == "alice"
    body = {"url": "https://hooks.example.com/b"}
    put = client_for(user).put(f"{URL}{mine.data['id']}/", body, format="json")
    assert put.status_code == 200 and put.data["is_global"] is False


def test_staff_without_view_job_are_ordinary_owners(user, staff_user):
    """is_staff alone neither lists other people's endpoints nor makes global ones
    (a global endpoint hears about every job: that is seeing every job)."""
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    staff = client_for(staff_user)
    body = {"url": "https://hooks.example.com/carol", "is_global": True}
    assert staff.post(URL, body, format="json").status_code == 403
    mine = staff.post(URL, {"url": "https://hooks.example.com/carol"}, format="json")
    assert mine.status_code == 201 and mine.data["owner"] == "carol" and mine.data["is_global"] is False
    assert [e["id"] for e in staff.get(URL).data["results"]] == [mine.data["id"]]
    for other in (theirs, everyone):
        assert staff.get(f"{URL}{other.pk}/").status_code == 404
        assert staff.get(f"{URL}{other.pk}/deliveries/").status_code == 404
        assert staff.patch(f"{URL}{other.pk}/", {"enabled": False}, format="json").status_code == 404
        assert staff.delete(f"{URL}{other.pk}/").status_code == 404
    turned = staff.patch(f"{URL}{mine.data['id']}/", {"is_global": True}, format="json")
    assert turned.status_code == 403
    assert WebhookEndpoint.objects.get(pk=mine.data["id"]).owner == staff_user
    assert WebhookEndpoint.objects.filter(owner=None).count() == 1
    # With the permission, the same user may make it global.
    viewer = client_for(grant(staff_user, "view_job"))
    turned = viewer.patch(f"{URL}{mine.data['id']}/", {"is_global": True}, format="json")
    assert turned.status_code == 200 and turned.data["is_global"] is True


def test_rotating_the_secret_keeps_the_old_one_for_the_overlap(user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    old = endpoint.secret
    response = client_for(user).post(
        f"{URL}{endpoint.pk}/rotate-secret/", {"overlap_seconds": 600}, format="json"
    )
    assert response.status_code == 200
    assert response.data["secret"] != old and response.data["previous_secret_expires_at"]
    endpoint.refresh_from_db()
    assert endpoint.signing_secrets() == [response.data["secret"], old]
    assert "previous_secret" not in response.data


def test_a_second_rotation_within_the_overlap_is_refused_unless_it_ends_the_overlap(user):
    # The second rotation replaced the previous secret at once: receivers still on
    # the first, promised its overlap, rejected every message.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    first = endpoint.secret
    api = client_for(user)
    rotate = f"{URL}{endpoint.pk}/rotate-secret/"
    assert api.post(rotate, {"overlap_seconds": 86400}, format="json").status_code == 200
    again = api.post(rotate, {"overlap_seconds": 86400}, format="json")
    assert again.status_code == 409 and again.data["error"]["code"] == "conflict"
    assert "overlap_seconds 0" in again.data["error"]["message"]
    endpoint.refresh_from_db()
    assert first in endpoint.signing_secrets()
    now = api.post(rotate, {"overlap_seconds": 0}, format="json")  # a leaked secret: stop them all
    assert now.status_code == 200
    endpoint.refresh_from_db()
    assert endpoint.signing_secrets() == [now.data["secret"]]


@override_settings(TIME_ZONE="Asia/Kolkata")
def test_a_refused_rotation_writes_its_time_as_the_api_writes_times(user):
    # The 409's message wrote it with isoformat's "+00:00", every other time of the API "…Z".
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    rotate = f"{URL}{endpoint.pk}/rotate-secret/"
    api = client_for(user)
    until = api.post(rotate, {"overlap_seconds": 86400}, format="json").json()["previous_secret_expires_at"]
    again = api.post(rotate, {"overlap_seconds": 86400}, format="json")
    message = assert_error(again, 409, "conflict")["message"]
    assert until.endswith("Z") and f"The previous secret signs until {until} (the last" in message


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread with its own database connection; its result lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def held_after_read(monkeypatch: Any, name: str, target: Any = webhooks_api) -> threading.Event:
    """Make the first call of ``target.name`` (made after the endpoint was read) wait
    0.5 s, uncommitted; the event is set when it starts waiting."""
    reached = threading.Event()
    real = getattr(target, name)

    def slow(*args: Any) -> Any:
        if not reached.is_set():
            reached.set()
            time.sleep(0.5)
        return real(*args)

    monkeypatch.setattr(target, name, slow)
    return reached


POSTGRES_LOCKS = pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks are PostgreSQL's")


@POSTGRES_LOCKS
@pytest.mark.django_db(transaction=True)
def test_two_rotations_at_once_do_not_both_pass_the_overlap_check(user, monkeypatch):
    # Both read the endpoint before either wrote: both answered 200, and the second's
    # save dropped the secret the first had just returned (its receivers rejected everything).
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    api = client_for(user)
    rotate = f"{URL}{endpoint.pk}/rotate-secret/"
    reached = held_after_read(monkeypatch, "new_secret", rotation)
    first, got_first = in_thread(lambda: api.post(rotate, {"overlap_seconds": 600}, format="json"))
    assert reached.wait(5)
    second, got_second = in_thread(lambda: api.post(rotate, {"overlap_seconds": 600}, format="json"))
    first.join(10), second.join(10)
    responses = [*got_first, *got_second]
    assert sorted(r.status_code for r in responses) == [200, 409]
    endpoint.refresh_from_db()
    assert endpoint.secret == next(r.data["secret"] for r in responses if r.status_code == 200)


@POSTGRES_LOCKS
@pytest.mark.django_db(transaction=True)
def test_an_update_does_not_undo_a_delivery_that_disabled_the_endpoint_meanwhile(user, monkeypatch):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    api = client_for(user)
    reached = held_after_read(monkeypatch, "validate", webhooks_api.WebhookEndpointSerializer)
    patch, got = in_thread(lambda: api.patch(f"{URL}{endpoint.pk}/", {"description": "x"}, format="json"))
    assert reached.wait(5)
    # A delivery's failure disables it (jobstate.webhooks.delivery) while the PATCH runs.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        enabled=False, consecutive_failures=20, disabled_at=timezone.now(), disabled_reason="failing"
    )
    patch.join(10)
    assert got[0].status_code == 200
    endpoint.refresh_from_db()
    assert (endpoint.description, endpoint.enabled, endpoint.consecutive_failures) == ("x", False, 20)


def test_a_disabled_endpoint_shows_why_and_re_enabling_resets_it(user):
    endpoint = WebhookEndpoint.objects.create(
        owner=user,
        url="https://hooks.example.com/a",
        enabled=False,
        consecutive_failures=20,
        disabled_reason="disabled after 20 failed attempts in a row; the last: HTTP 500",
    )
    client = client_for(user)
    shown = client.get(f"{URL}{endpoint.pk}/").data
    assert shown["enabled"] is False and shown["disabled_reason"].startswith("disabled after 20")
    assert shown["consecutive_failures"] == 20
    response = client.patch(f"{URL}{endpoint.pk}/", {"enabled": True}, format="json")
    assert response.status_code == 200
    assert response.data["enabled"] and response.data["disabled_reason"] == ""
    assert response.data["consecutive_failures"] == 0


def test_deliveries_are_listed_newest_first(user, other_user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    job = make_job(user)  # shown by the job it is about (``visibility``): a real one of hers
    for attempt, code in [(1, 500), (2, 200)]:
        WebhookDelivery.objects.create(
            endpoint=endpoint,
            webhook_id="msg_1",
            event="job.completed",
            job_id=job.pk,
            attempt=attempt,
            ok=code == 200,
            status_code=code,
            duration_ms=12,
        )
    data = client_for(user).get(f"{URL}{endpoint.pk}/deliveries/").data
    assert [(d["attempt"], d["status_code"], d["ok"]) for d in data["results"]] == [
        (2, 200, True),
        (1, 500, False),
    ]
    assert client_for(other_user).get(f"{URL}{endpoint.pk}/deliveries/").status_code == 404


def delivered(endpoint: WebhookEndpoint, job: Job, body: str) -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id=f"msg_{uuid.uuid4().hex}",
        event="job.completed",
        job_id=job.pk,
        ok=True,
        status_code=200,
        response_body=body,
    )


def test_a_reassigned_endpoint_shows_its_new_owner_only_the_deliveries_about_their_jobs(
    user, other_user, staff_user
):
    """An operator gave alice's endpoint to bob: its records of alice's jobs (their
    ids, her receiver's answers) stayed with it and bob read them."""
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    alices = delivered(endpoint, make_job(user), "alice's receiver says")
    endpoint.owner = other_user  # as the admin's owner field saves it
    endpoint.save()
    bobs = delivered(endpoint, make_job(other_user), "bob's receiver says")
    listed = client_for(other_user).get(f"{URL}{endpoint.pk}/deliveries/").data["results"]
    assert [d["id"] for d in listed] == [bobs.pk]
    assert client_for(user).get(f"{URL}{endpoint.pk}/deliveries/").status_code == 404
    # Those who may see every job see every record.
    viewer = client_for(grant(staff_user, "view_job"))
    listed = viewer.get(f"{URL}{endpoint.pk}/deliveries/").data["results"]
    assert [d["id"] for d in listed] == [bobs.pk, alices.pk]


def test_an_owner_does_not_see_the_deliveries_a_global_endpoint_made_before_it_was_theirs(user, staff_user):
    # The API's is_global: false on a global endpoint makes it its editor's own; an
    # editor who later may not see every job sees the records of their own jobs only.
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    delivered(everyone, make_job(user), "about alice's job")
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    assert editor.patch(f"{URL}{everyone.pk}/", {"is_global": False}, format="json").status_code == 200
    assert len(editor.get(f"{URL}{everyone.pk}/deliveries/").data["results"]) == 1
    staff_user.user_permissions.clear()
    own = delivered(everyone, make_job(staff_user), "about carol's job")
    listed = client_for(staff_user).get(f"{URL}{everyone.pk}/deliveries/").data["results"]
    assert [d["id"] for d in listed] == [own.pk]


def test_an_endpoint_that_changes_owner_while_disabled_no_longer_quotes_the_previous_owners_error(
    user, staff_user
):
    """Its reason quoted the last failed delivery, about a job of the previous owner
    (a global endpoint's: anyone's), whose record the new owner does not see."""
    from jobstate.webhooks import delivery

    everyone = WebhookEndpoint.objects.create(
        owner=None,
        url="https://hooks.example.com/all",
        enabled=False,
        consecutive_failures=20,
        disabled_at=timezone.now(),
        disabled_reason="disabled after 20 failed attempts in a row; the last: BadStatusLine: "
        "'alice-invoice-7'. " + delivery.REENABLE,
    )
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    changed = editor.patch(f"{URL}{everyone.pk}/", {"is_global": False}, format="json")
    assert changed.status_code == 200 and changed.data["owner"] == "carol"
    # Still disabled (the receiver is the same), but carol's count starts at 0 (ownership).
    assert changed.data["enabled"] is False and changed.data["consecutive_failures"] == 0
    assert changed.data["disabled_reason"] == delivery.OWNER_CHANGED
    assert "alice-invoice-7" not in changed.data["disabled_reason"]
    # Re-enabling it still clears the reason; a change that keeps the owner keeps it.
    shown = editor.patch(f"{URL}{everyone.pk}/", {"description": "x"}, format="json").data
    assert shown["disabled_reason"] == delivery.OWNER_CHANGED
    shown = editor.patch(f"{URL}{everyone.pk}/", {"enabled": True, "is_global": True}, format="json").data
    assert shown["enabled"] and shown["disabled_reason"] == "" and shown["consecutive_failures"] == 0


def test_an_enabled_endpoint_that_changes_owner_keeps_an_empty_reason(staff_user):
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    changed = editor.patch(f"{URL}{everyone.pk}/", {"is_global": False}, format="json")
    assert changed.status_code == 200 and changed.data["disabled_reason"] == ""


@pytest.mark.parametrize("overlap", [False, True])
def test_an_endpoint_that_changes_owner_keeps_nothing_of_the_previous_owners(user, staff_user, overlap):
    """Its failure count counted the previous owner's deliveries (4 of 5: the new
    owner's first failure disabled it), and the previous owner holds its secret (and
    the previous one, in an overlap), which went on signing: they could sign messages
    the new owner's receiver trusts. The new secret is shown once, in the answer to
    the change, as a rotation's."""
    theirs = WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", consecutive_failures=4
    )
    if overlap:
        theirs = rotation.rotate(theirs.pk, 3600)
    alices = set(theirs.signing_secrets())
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    changed = editor.patch(f"{URL}{theirs.pk}/", {"is_global": True}, format="json")
    assert changed.status_code == 200 and changed.data["is_global"] is True
    stored = WebhookEndpoint.objects.get(pk=theirs.pk)
    assert changed.data["consecutive_failures"] == stored.consecutive_failures == 0
    assert changed.data["secret"] == stored.secret and stored.secret not in alices
    assert stored.signing_secrets() == [stored.secret] and stored.previous_secret == ""
    assert changed.data["previous_secret_expires_at"] is None
    assert editor.get(f"{URL}{theirs.pk}/").data["secret"] is None  # shown once
    # A change that keeps the owner (is_global as it is) keeps the secret and the count.
    WebhookEndpoint.objects.filter(pk=theirs.pk).update(consecutive_failures=2)
    kept = editor.patch(f"{URL}{theirs.pk}/", {"is_global": True, "description": "x"}, format="json")
    assert kept.status_code == 200 and kept.data["secret"] is None
    assert kept.data["consecutive_failures"] == 2
    assert WebhookEndpoint.objects.get(pk=theirs.pk).secret == stored.secret
    # Made the editor's own: the same, and re-enabled with it, the reason goes too.
    WebhookEndpoint.objects.filter(pk=theirs.pk).update(
        enabled=False, disabled_at=timezone.now(), disabled_reason="disabled after ..."
    )
    mine = editor.patch(f"{URL}{theirs.pk}/", {"is_global": False, "enabled": True}, format="json")
    assert mine.status_code == 200 and mine.data["owner"] == "carol" and mine.data["enabled"] is True
    assert (mine.data["consecutive_failures"], mine.data["disabled_at"], mine.data["disabled_reason"]) == (
        0,
        None,
        "",
    )
    assert mine.data["secret"] == WebhookEndpoint.objects.get(pk=theirs.pk).secret != stored.secret


@override_settings(TIME_ZONE="Asia/Kolkata", REST_FRAMEWORK={"DATETIME_FORMAT": "%d.%m.%Y %H:%M"})
def test_times_are_utc_iso_8601_whatever_the_projects_settings(user):
    # As the jobs' (tests/test_api_jobs.py): not the project's format or time zone.
    client = client_for(user)
    created = client.post(URL, {"url": "https://hooks.example.com/a"}, format="json").json()
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    rotated = client.post(f"{URL}{endpoint.pk}/rotate-secret/", {}, format="json").json()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, webhook_id="msg_1", event="job.completed", job_id=make_job(user).pk
    )
    [listed] = client.get(f"{URL}{endpoint.pk}/deliveries/").json()["results"]
    endpoint.refresh_from_db()
    for text, moment in [
        (created["created_at"], endpoint.created_at),
        (rotated["updated_at"], endpoint.updated_at),
        (rotated["previous_secret_expires_at"], endpoint.previous_secret_expires_at),
        (listed["created_at"], delivery.created_at),
    ]:
        assert text.endswith("Z"), text
        assert dt.datetime.fromisoformat(text) == moment


def test_the_admin_lists_endpoints_and_deliveries(admin_client, user):
    endpoint = WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", disabled_reason="x"
    )
    WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id="msg_9",
        event="job.failed",
        job_id="8d6f3c52-4f0c-4b8e-9d0a-0c3f1f0a1b2c",
    )
    assert b"hooks.example.com" in admin_client.get("/admin/jobstate/webhookendpoint/").content
    page = admin_client.get(f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200 and b"msg_9" in page.content
    assert b"msg_9" in admin_client.get("/admin/jobstate/webhookdelivery/").content


def test_staff_who_may_view_all_read_others_endpoints_but_not_their_secrets(user, staff_user):
    """jobstate.view_job is a read permission: another user's endpoint (or a global
    one) is shown without its secret (it forges messages) and stays as it was."""
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    viewer = client_for(grant(staff_user, "view_job"))
    listed = viewer.get(URL).data["results"]
    assert {e["id"]: e["secret"] for e in listed} == {theirs.pk: None, everyone.pk: None}
    for other in (theirs, everyone):
        shown = viewer.get(f"{URL}{other.pk}/")
        assert shown.status_code == 200 and shown.data["secret"] is None
        assert shown.data["url"] == other.url
        assert viewer.get(f"{URL}{other.pk}/deliveries/").status_code == 200
        attempts = [
            viewer.patch(f"{URL}{other.pk}/", {"url": "https://attacker.example/collect"}, format="json"),
            viewer.put(f"{URL}{other.pk}/", {"url": "https://attacker.example/collect"}, format="json"),
            viewer.patch(f"{URL}{other.pk}/", {"is_global": other.owner_id is not None}, format="json"),
            viewer.patch(f"{URL}{other.pk}/", {"enabled": False}, format="json"),
            viewer.post(f"{URL}{other.pk}/rotate-secret/", {}, format="json"),
            viewer.delete(f"{URL}{other.pk}/"),
        ]
        assert [a.status_code for a in attempts] == [403] * 6
        assert "secret" not in str(attempts[0].data)
        stored = WebhookEndpoint.objects.get(pk=other.pk)
        assert (stored.url, stored.owner_id, stored.enabled, stored.secret) == (
            other.url,
            other.owner_id,
            True,
            other.secret,
        )
    # The owner still sees and manages their own.
    alice = client_for(user)
    assert alice.get(f"{URL}{theirs.pk}/").data["secret"] is None  # shown once, when made
    assert alice.post(f"{URL}{theirs.pk}/rotate-secret/", {}, format="json").status_code == 200
    # A viewer's new global endpoint shows its secret once, to its maker.
    made = viewer.post(URL, {"url": "https://hooks.example.com/mine", "is_global": True}, format="json")
    assert made.status_code == 201
    assert made.data["secret"] == WebhookEndpoint.objects.get(pk=made.data["id"]).secret
    assert viewer.get(f"{URL}{made.data['id']}/").data["secret"] is None


def test_staff_with_the_model_permissions_manage_others_endpoints(user, staff_user, admin_user):
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    assert editor.get(f"{URL}{theirs.pk}/").data["secret"] is None  # shown once, when made
    moved = editor.patch(f"{URL}{theirs.pk}/", {"url": "https://hooks.example.com/moved"}, format="json")
    assert moved.status_code == 200 and moved.data["url"] == "https://hooks.example.com/moved"
    rotated = editor.post(f"{URL}{everyone.pk}/rotate-secret/", {}, format="json")
    assert rotated.status_code == 200 and rotated.data["secret"] != everyone.secret
    made_global = editor.patch(f"{URL}{theirs.pk}/", {"is_global": True}, format="json")
    assert made_global.status_code == 200 and made_global.data["is_global"] is True
    assert editor.delete(f"{URL}{theirs.pk}/").status_code == 403  # no delete_webhookendpoint
    deleter = client_for(grant(staff_user, "delete_webhookendpoint"))
    assert deleter.delete(f"{URL}{theirs.pk}/").status_code == 204
    # Superusers hold every permission.
    root = client_for(admin_user)
    assert root.get(f"{URL}{everyone.pk}/").data["secret"] is None  # shown once, when made
    assert root.delete(f"{URL}{everyone.pk}/").status_code == 204
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com:99999/",
        "https://example.com:0/x",
        "http://example.com:-1/",
        "http://[::1/x",
        "https://hooks.example.com/caf\u00e9",  # was accepted, then never delivered
        "https://b\u00fccher.example/x",
    ],
)
def test_a_url_with_a_bad_port_is_a_400_on_url(user, url):
    client = client_for(user)
    response = client.post(URL, {"url": url}, format="json")
    assert response.status_code == 400 and "url" in response.data["error"]["fields"]
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    response = client.patch(f"{URL}{endpoint.pk}/", {"url": url}, format="json")
    assert response.status_code == 400 and "url" in response.data["error"]["fields"]
    assert list(WebhookEndpoint.objects.values_list("url", flat=True)) == ["https://hooks.example.com/a"]


@pytest.mark.parametrize("kinds", [["a\u0000b"], [""], ["x" * 201], "x", [["x"]]])
def test_kinds_are_checked(user, kinds):
    response = client_for(user).post(
        URL, {"url": "https://hooks.example.com/a", "kinds": kinds}, format="json"
    )
    assert response.status_code == 400 and "kinds" in response.data["error"]["fields"]
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("kind", [" report.export", "report.export ", "\treport.export\n", "\u00a0a"])
def test_a_kind_with_surrounding_whitespace_is_a_400_not_stripped(user, kind):
    """An enqueue takes its kind exactly as sent; a subscription stripped it, and
    so heard about a kind other than the one it was given."""
    client = client_for(user)
    body = {"url": "https://hooks.example.com/a", "kinds": ["a", kind]}
    error = assert_error(client.post(URL, body, format="json"), 400, "invalid")
    assert "surrounding whitespace" in str(error["fields"]["kinds"]) and repr(kind)[:20] in error["message"]
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a", kinds=["a"])
    assert_error(client.patch(f"{URL}{endpoint.pk}/", {"kinds": [kind]}, format="json"), 400, "invalid")
    endpoint.refresh_from_db()
    assert endpoint.kinds == ["a"]
    inner = client.post(URL, {**body, "kinds": ["report. export"]}, format="json")
    assert inner.status_code == 201 and inner.data["kinds"] == ["report. export"]  # inside: as sent


def test_kinds_are_at_most_a_hundred_and_repeats_are_stored_once(user):
    """5,000 kinds or repeated events were stored as sent, and the outbox read
    them on every transition of the owner's jobs."""
    client = client_for(user)
    too_many = [f"kind.{n}" for n in range(101)]
    response = client.post(URL, {"url": "https://hooks.example.com/a", "kinds": too_many}, format="json")
    assert response.status_code == 400 and "kinds" in response.data["error"]["fields"]
    assert "At most 100 job kinds" in str(response.data["error"]["fields"]["kinds"])
    assert not WebhookEndpoint.objects.exists()
    body = {
        "url": "https://hooks.example.com/a",
        "kinds": ["b", "a", "b", *too_many[:99], "a"] * 50,  # 101 distinct: too many
        "events": ["job.failed", "job.completed", "job.failed"] * 100,
    }
    assert client.post(URL, body, format="json").status_code == 400
    body["kinds"] = ["b", "a", "b", *too_many[:98], "a"] * 50  # 100 distinct
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.data
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.kinds == ["b", "a", *too_many[:98]] and response.data["kinds"] == endpoint.kinds
    assert endpoint.events == ["job.failed", "job.completed"]
    response = client.patch(f"{URL}{endpoint.pk}/", {"kinds": too_many}, format="json")
    assert response.status_code == 400 and "kinds" in response.data["error"]["fields"]
    endpoint.refresh_from_db()
    assert endpoint.kinds == ["b", "a", *too_many[:98]]


def test_a_malformed_stored_endpoint_does_not_break_cancelling_a_job(user):
    """An endpoint saved around the checks (events=5) is skipped and logged, and
    the job's transition goes on."""
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    broken = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/b")
    WebhookEndpoint.objects.filter(pk=broken.pk).update(events=5)
    job = make_job(user)
    response = client_for(user).post(job_url(job, "cancel/"), {}, format="json")
    assert response.status_code == 200, response.data
    (queued,) = Job.objects.filter(kind=outbox.KIND)
    assert queued.parameters["event"] == "job.cancelled" and queued.parameters["endpoint"] != broken.pk


LOOSE_TYPES = [
    # DRF's BooleanField took "yes", "on", "1", 1 and 0; its CharField took numbers.
    ("enabled", "yes", "enabled: Must be a valid boolean."),
    ("enabled", 1, "enabled: Must be a valid boolean."),
    ("enabled", "false", "enabled: Must be a valid boolean."),
    ("is_global", "1", "is_global: Must be a valid boolean."),
    ("is_global", 0, "is_global: Must be a valid boolean."),
    ("url", 5, "url: Not a valid string."),
    ("description", 5, "description: Not a valid string."),
    ("description", 1.5, "description: Not a valid string."),
    ("kinds", [5], "kinds.0: Not a valid string."),
    ("kinds", [1.5], "kinds.0: Not a valid string."),
    ("events", [5], "events.0: Not a valid string."),
]


@pytest.mark.parametrize("field, value, message", LOOSE_TYPES)
def test_a_wrong_json_type_is_a_400_naming_the_field_and_writes_nothing(user, field, value, message):
    # As strict as the jobs API's inputs (tests/test_api_jobs.py: {"kind": 12} is a 400).
    client = client_for(user)
    body = {"url": "https://hooks.example.com/a", field: value}
    response = client.post(URL, body, format="json")
    assert response.status_code == 400 and response.data["error"]["message"] == message
    assert list(response.data["error"]["fields"]) == [field]
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a", enabled=False)
    before = WebhookEndpoint.objects.values().get()
    for call in (client.patch, client.put):
        response = call(f"{URL}{endpoint.pk}/", body, format="json")
        assert response.status_code == 400 and response.data["error"]["message"] == message
    assert WebhookEndpoint.objects.values().get() == before


@pytest.mark.parametrize("value", ["600", 600.0, "600.0"])
def test_a_rotations_overlap_is_a_json_integer(user, value):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    response = client_for(user).post(
        f"{URL}{endpoint.pk}/rotate-secret/", {"overlap_seconds": value}, format="json"
    )
    assert response.status_code == 400 and list(response.data["error"]["fields"]) == ["overlap_seconds"]
    assert WebhookEndpoint.objects.get().secret == endpoint.secret


def test_json_booleans_and_strings_still_pass(user):
    client = client_for(user)
    body = {"url": "https://hooks.example.com/a", "enabled": False, "is_global": False, "kinds": ["a.b"]}
    made = client.post(URL, {**body, "description": "mine"}, format="json")
    assert made.status_code == 201, made.data
    assert (made.data["enabled"], made.data["kinds"], made.data["description"]) == (False, ["a.b"], "mine")
    patched = client.patch(f"{URL}{made.data['id']}/", {"enabled": True}, format="json")
    assert patched.status_code == 200 and patched.data["enabled"] is True


def test_an_event_with_a_lone_surrogate_is_a_400(user):
    # DRF's refusal ('"…" is not a valid choice.') repeated the lone surrogate, which
    # the JSON renderer cannot encode: a 500.
    client = client_for(user)
    raw = '{"url": "https://hooks.example.com/a", "events": ["job.\\ud800"]}'
    response = client.post(URL, raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "events.0: Text must be valid Unicode."
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    response = client.patch(f"{URL}{endpoint.pk}/", raw, content_type="application/json")
    assert response.status_code == 400 and "events" in response.json()["error"]["fields"]
    assert WebhookEndpoint.objects.get().events == endpoint.events


def test_a_field_an_endpoint_does_not_take_is_a_400_naming_it_and_writes_nothing(user):
    # "secret", "owner" and typos were ignored: made with a secret of the server's, a 201.
    client = client_for(user)
    body = {"url": "https://hooks.example.com/a", "secret": "whsec_mine", "owner": "bob", "bogus": 1}
    error = client.post(URL, body, format="json").json()["error"]
    assert error["code"] == "invalid" and error["message"] == "secret: This field is read-only."
    read_only = ["This field is read-only."]
    assert error["fields"] == {"secret": read_only, "owner": read_only, "bogus": ["Unknown field."]}
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    before = WebhookEndpoint.objects.values().get()
    for call in (client.patch, client.put):
        response = call(
            f"{URL}{endpoint.pk}/", {"url": "https://hooks.example.com/b", "enabeld": False}, format="json"
        )
        assert response.status_code == 400 and response.json()["error"]["fields"] == {
            "enabeld": ["Unknown field."]
        }
    rotated = client.post(f"{URL}{endpoint.pk}/rotate-secret/", {"overlap": 0}, format="json")
    assert rotated.status_code == 400 and rotated.json()["error"]["fields"] == {"overlap": ["Unknown field."]}
    assert WebhookEndpoint.objects.values().get() == before


def test_a_get_echoed_back_in_a_put_is_a_400_naming_its_read_only_fields(user):
    """Strict: a PUT takes the writable fields only (docs/reference/rest-api.md says why)."""
    client = client_for(user)
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    shown = client.get(f"{URL}{endpoint.pk}/").json()
    response = client.put(f"{URL}{endpoint.pk}/", {**shown, "description": "new"}, format="json")
    assert response.status_code == 400
    read_only = {"id", "owner", "answerable", *WebhookEndpoint.SERVER_FIELDS}
    assert set(response.json()["error"]["fields"]) == read_only
    assert WebhookEndpoint.objects.get().description == ""
    writable = {k: v for k, v in shown.items() if k not in read_only}
    response = client.put(f"{URL}{endpoint.pk}/", {**writable, "description": "new"}, format="json")
    assert response.status_code == 200 and WebhookEndpoint.objects.get().description == "new"


def test_a_list_carries_no_secrets(user, staff_user):
    """One GET of the list gave every endpoint's secret to whoever may change them
    (staff with change_webhookendpoint: every user's, and the global ones'); it is
    shown once, in the answer that made it (see test_a_secret_is_shown_once...)."""
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    everyone = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/all")
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    alice = client_for(user)
    assert {e["id"]: e["secret"] for e in editor.get(URL).data["results"]} == {
        theirs.pk: None,
        everyone.pk: None,
    }
    assert [e["secret"] for e in alice.get(URL).data["results"]] == [None]
    assert editor.get(f"{URL}{everyone.pk}/").data["secret"] is None
    assert alice.get(f"{URL}{theirs.pk}/").data["secret"] is None


def test_a_secret_is_shown_once_in_the_answer_that_made_it(user, staff_user):
    """A GET, PUT or PATCH of the endpoint showed its secret to its owner (and to staff
    with change_webhookendpoint) at any later time: whoever held the owner's token
    could read it again. Only the create and rotate-secret answers show it now."""
    alice = client_for(user)
    made = alice.post(URL, {"url": "https://hooks.example.com/a"}, format="json")
    assert made.status_code == 201
    endpoint = WebhookEndpoint.objects.get()
    assert made.data["secret"] == endpoint.secret
    page = f"{URL}{endpoint.pk}/"
    editor = client_for(grant(staff_user, "view_job", "change_webhookendpoint"))
    for client in (alice, editor):
        answers = [
            client.get(page),
            client.patch(page, {"description": "x"}, format="json"),
            client.put(page, {"url": "https://hooks.example.com/b"}, format="json"),
        ]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [a.data["secret"] for a in answers] == [None, None, None]
        assert endpoint.secret not in str([a.content for a in answers])
    rotated = alice.post(f"{page}rotate-secret/", {"overlap_seconds": 0}, format="json")
    assert rotated.status_code == 200
    assert rotated.data["secret"] == WebhookEndpoint.objects.get().secret != endpoint.secret
    assert alice.get(page).data["secret"] is None


def test_whoever_makes_or_changes_a_global_endpoint_answers_for_it(user, staff_user, admin_user):
    viewer = grant(staff_user, "view_job")
    made = client_for(viewer).post(
        URL, {"url": "https://hooks.example.com/all", "is_global": True}, format="json"
    )
    assert made.status_code == 201 and made.data["answerable"] == "carol"
    page = f"{URL}{made.data['id']}/"
    assert client_for(admin_user).get(page).data["answerable"] == "carol"  # reading changes nothing
    changed = client_for(admin_user).patch(page, {"description": "audit feed"}, format="json")
    assert changed.status_code == 200 and changed.data["answerable"] == admin_user.get_username()
    assert WebhookEndpoint.objects.get(pk=made.data["id"]).answerable_id == admin_user.pk
    refused = client_for(admin_user).patch(page, {"answerable": "alice"}, format="json")
    assert_error(refused, 400, "invalid")
    # An owner's endpoint is answered for by its owner.
    owned = client_for(admin_user).patch(page, {"is_global": False}, format="json")
    assert owned.status_code == 200 and owned.data["answerable"] is None
    assert WebhookEndpoint.objects.get(pk=made.data["id"]).answerable_id is None
    mine = client_for(user).post(URL, {"url": "https://hooks.example.com/a"}, format="json")
    assert mine.data["answerable"] is None
