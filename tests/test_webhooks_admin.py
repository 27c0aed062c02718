"""The admin's webhook endpoint form checks what the API checks: the outbox reads
these fields inside every job's transition."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from jobstate.admin.webhooks import WebhookEndpointForm
from jobstate.webhooks import outbox, rotation
from jobstate.webhooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db

ADD = "/admin/jobstate/webhookendpoint/add/"
DELIVERIES = "/admin/jobstate/webhookdelivery/"
GOOD = {
    "owner": "",
    "url": "https://hooks.example.com/a",
    "description": "",
    "events": '["job.completed"]',
    "kinds": "[]",
    "enabled": "on",
    "deliveries-TOTAL_FORMS": "0",
    "deliveries-INITIAL_FORMS": "0",
    "deliveries-MIN_NUM_FORMS": "0",
    "deliveries-MAX_NUM_FORMS": "0",
}


@pytest.fixture(autouse=True)
def fresh_answers():
    outbox.forget()
    yield
    outbox.forget()


def errors(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.status_code  # the form again, not a redirect
    return dict(response.context["adminform"].form.errors)


def test_a_valid_endpoint_is_saved(admin_client):
    response = admin_client.post(ADD, {**GOOD, "kinds": '["report.export"]'})
    assert response.status_code == 302
    (endpoint,) = WebhookEndpoint.objects.all()
    assert (endpoint.events, endpoint.kinds, endpoint.owner_id) == (
        ["job.completed"],
        ["report.export"],
        None,
    )
    assert admin_client.post(ADD, {**GOOD, "kinds": ""}).status_code == 302  # empty: every kind
    assert WebhookEndpoint.objects.filter(kinds=[]).count() == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("events", "5"),
        ("events", '"job.completed"'),
        ("events", "[]"),
        ("events", '["job.nope"]'),
        ("events", "[1e400]"),
        ("events", '[["job.completed"]]'),
        ("kinds", '"x"'),
        ("kinds", '["a\\u0000b"]'),
        ("kinds", '["\\ud800"]'),  # a lone surrogate: jsonb refused it, a 500 on PostgreSQL
        ("kinds", '[""]'),
        ("kinds", "[5]"),
        ("kinds", '{"x": 1}'),
        ("kinds", '["' + "x" * 201 + '"]'),
        ("url", "http://example.com:99999/"),
        ("url", "http://127.0.0.1/"),
        ("url", "http://[::1]/x"),
        ("url", "ftp://example.com/"),
        ("url", "https://hooks.example.com/caf\u00e9"),
    ],
)
def test_what_the_api_refuses_the_admin_refuses(admin_client, field, value):
    assert field in errors(admin_client.post(ADD, {**GOOD, field: value}))
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("kinds", ['[" report.export "]', '["a", "report.export\\t"]', '["\\u00a0a"]'])
def test_the_admin_refuses_a_kind_with_surrounding_whitespace(admin_client, user, kinds):
    # It stripped it, as the API did: an enqueue takes its kind exactly as sent.
    found = errors(admin_client.post(ADD, {**GOOD, "kinds": kinds}))
    assert "surrounding whitespace" in str(found["kinds"])
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a", kinds=["a"])
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    assert "kinds" in errors(admin_client.post(page, {**GOOD, "owner": str(user.pk), "kinds": kinds}))
    endpoint.refresh_from_db()
    assert endpoint.kinds == ["a"]


def test_the_admin_refuses_more_than_a_hundred_kinds_and_stores_repeats_once(admin_client, user):
    import json

    too_many = json.dumps([f"kind.{n}" for n in range(101)])
    found = errors(admin_client.post(ADD, {**GOOD, "kinds": too_many}))
    assert "At most 100 job kinds" in str(found["kinds"])
    assert not WebhookEndpoint.objects.exists()
    body = {
        **GOOD,
        "kinds": '["b", "a", "b", "a"]',
        "events": '["job.failed", "job.completed", "job.failed"]',
    }
    assert admin_client.post(ADD, body).status_code == 302
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.kinds, endpoint.events) == (["b", "a"], ["job.failed", "job.completed"])
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    assert "kinds" in errors(admin_client.post(page, {**body, "kinds": too_many}))
    endpoint.refresh_from_db()
    assert endpoint.kinds == ["b", "a"]


@pytest.mark.parametrize("depth", [150, 990, 100_000])
@pytest.mark.parametrize("field", ["events", "kinds"])
def test_json_nested_too_deep_is_a_form_error(admin_client, user, field, depth):
    # json.loads ran out of stack (RecursionError, a 500) on the posted value, on the
    # value shown again and on the page's initial value of the field.
    deep = "[" * depth + '"job.completed"' + "]" * depth
    found = errors(admin_client.post(ADD, {**GOOD, field: deep}))
    assert "Nested more than 100 levels deep." in str(found[field])
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    body = {**GOOD, "owner": str(user.pk), "description": "changed"}
    assert admin_client.post(page, {**body, f"initial-{field}": deep}).status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.description == "changed"


def test_changing_an_endpoint_is_checked_too(admin_client, user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    body = {**GOOD, "owner": str(user.pk), "events": "5"}
    assert "events" in errors(admin_client.post(page, body))
    endpoint.refresh_from_db()
    assert endpoint.events == ["job.completed", "job.failed", "job.cancelled", "job.partial"]


@override_settings(JOBSTATE={"WEBHOOK_ALLOW_PRIVATE": True})
def test_private_urls_pass_in_the_admin_when_allowed(admin_client):
    assert admin_client.post(ADD, {**GOOD, "url": "http://127.0.0.1:8000/x"}).status_code == 302


def test_only_staff_who_may_view_every_job_may_leave_the_owner_empty(client, django_user_model, user):
    # As in the API: an endpoint without an owner hears about every job.
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("hooks-admin", password="x", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="_webhookendpoint"))
    client.force_login(staff)
    assert "owner" in errors(client.post(ADD, GOOD))
    # Another owner's endpoint, pointed at one's own URL, would hear about their jobs.
    assert "name another owner" in str(errors(client.post(ADD, {**GOOD, "owner": str(user.pk)}))["owner"])
    assert client.post(ADD, {**GOOD, "owner": str(staff.pk)}).status_code == 302  # one's own: fine
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    staff = django_user_model.objects.get(pk=staff.pk)  # permissions are cached per object
    client.force_login(staff)
    assert client.post(ADD, GOOD).status_code == 302
    assert client.post(ADD, {**GOOD, "owner": str(user.pk)}).status_code == 302
    assert WebhookEndpoint.objects.filter(owner=None).count() == 1


def test_staff_with_change_job_see_every_endpoint_as_in_the_api(client, django_user_model, user):
    # "May see every job" is view_job or change_job everywhere (models.job.may_view_all).
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("job-editor", password="x", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "add_webhookendpoint", "change_job"])
    )
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    client.force_login(staff)
    listed = client.get("/admin/jobstate/webhookendpoint/").context["cl"].result_list
    assert [e.pk for e in listed] == [theirs.pk]
    assert client.post(ADD, GOOD).status_code == 302  # global: as the API allows them


def test_without_view_job_staff_see_and_change_only_their_own_endpoints(client, django_user_model, user):
    # As in the API: another user's endpoint could be pointed at one's own URL.
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("hooks-admin", password="x", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "change_webhookendpoint"]),
        Permission.objects.get(codename="view_webhookdelivery"),
    )
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    mine = WebhookEndpoint.objects.create(owner=staff, url="https://hooks.example.com/mine")
    from jobstate.webhooks.models import WebhookDelivery

    for endpoint, job_owner in ((theirs, user), (mine, staff)):
        WebhookDelivery.objects.create(
            endpoint=endpoint, webhook_id="msg", event="job.completed", job_id=services_job(job_owner).pk
        )
    client.force_login(staff)
    listed = client.get("/admin/jobstate/webhookendpoint/").context["cl"].result_list
    assert [e.pk for e in listed] == [mine.pk]
    change = f"/admin/jobstate/webhookendpoint/{theirs.pk}/change/"
    evil = {**GOOD, "owner": str(user.pk), "url": "https://evil.example.com/"}
    assert client.post(change, evil).status_code == 302  # to the list: no such endpoint here
    assert WebhookEndpoint.objects.get(pk=theirs.pk).url == "https://hooks.example.com/alice"
    deliveries = client.get("/admin/jobstate/webhookdelivery/").context["cl"].result_list
    assert [d.endpoint_id for d in deliveries] == [mine.pk]


@pytest.mark.parametrize("query", ["?url__regex=(", "?owner=99999999999999999999999", "?webhook_id__regex=("])
def test_the_webhook_lists_refuse_undeclared_lookups(admin_client, user, query):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    outbox.queue_delivery(endpoint.pk, services_job(user).pk, "job.completed")
    for page in ("/admin/jobstate/webhookendpoint/", "/admin/jobstate/webhookdelivery/"):
        response = admin_client.get(page + query)
        assert response.status_code == 302 and response["Location"].endswith("?e=1"), page


def services_job(user: Any) -> Any:
    from jobstate import services

    return services.enqueue("test.echo", {}, owner=user)


def secrets_in(html: str) -> list[str]:
    import re

    return re.findall(r"whsec_[A-Za-z0-9+/=]+", html)


def test_the_endpoint_page_shows_no_secret_and_offers_a_rotation_to_those_who_may_change_it(
    client, user, staff_user
):
    # It showed the secret to whoever may change the endpoint, as often as they liked.
    from tests.api_support import grant

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    rotate = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/rotate-secret/"
    client.force_login(grant(staff_user, "view_job", "view_webhookendpoint"))
    response = client.get(page)
    assert response.status_code == 200 and secrets_in(response.content.decode()) == []
    assert rotate not in response.content.decode()
    assert (
        client.get(rotate).status_code == 403
        and client.post(rotate, {"overlap_seconds": 0}).status_code == 403
    )
    client.force_login(grant(staff_user, "change_webhookendpoint"))
    html = client.get(page).content.decode()
    assert secrets_in(html) == [] and "Set. It is shown once" in html and rotate in html
    assert "(the endpoint&#x27;s creation, a rotation, a change of owner)" in html
    assert secrets_in(client.get("/admin/jobstate/webhookendpoint/").content.decode()) == []
    assert WebhookEndpoint.objects.get().secret == endpoint.secret


def test_a_new_endpoints_secret_is_shown_once_after_it_is_saved(admin_client):
    # The add form showed a secret of an unsaved instance (not the one stored), and the
    # stored one was shown on the endpoint's page ever after.
    assert secrets_in(admin_client.get(ADD).content.decode()) == []
    response = admin_client.post(ADD, GOOD)
    endpoint = WebhookEndpoint.objects.get()
    secret_page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/secret/"
    assert response.status_code == 302 and response["Location"] == secret_page
    shown = admin_client.get(secret_page)
    assert shown.status_code == 200 and secrets_in(shown.content.decode()) == [endpoint.secret]
    assert 'href="/admin/jobstate/webhookendpoint/"' in shown.content.decode()  # on to the list
    again = admin_client.get(secret_page).content.decode()
    assert secrets_in(again) == [] and "is not shown again" in again
    change = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    assert secrets_in(admin_client.get(change).content.decode()) == []
    # "Save and continue editing": the same once, then the endpoint's page.
    admin_client.post(ADD, {**GOOD, "_continue": "1"})
    other = WebhookEndpoint.objects.exclude(pk=endpoint.pk).get()
    shown = admin_client.get(f"/admin/jobstate/webhookendpoint/{other.pk}/secret/").content.decode()
    assert (
        secrets_in(shown) == [other.secret] and f"/admin/jobstate/webhookendpoint/{other.pk}/change/" in shown
    )


def test_rotating_in_the_admin_shows_the_new_secret_once_by_the_apis_rules(admin_client, client, user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    old = endpoint.secret
    rotate = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/rotate-secret/"
    secret_page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/secret/"
    form = admin_client.get(rotate)
    assert form.status_code == 200 and secrets_in(form.content.decode()) == []
    assert 'value="86400"' in form.content.decode()  # WEBHOOK_SECRET_OVERLAP_SECONDS
    for bad in ("", "soon", "-1", str(30 * 24 * 3600 + 1)):
        refused = admin_client.post(rotate, {"overlap_seconds": bad})
        assert refused.status_code == 200 and refused.context["form"].errors, bad
    assert WebhookEndpoint.objects.get().secret == old
    # Nothing to see before a rotation.
    assert secrets_in(admin_client.get(secret_page).content.decode()) == []
    response = admin_client.post(rotate, {"overlap_seconds": "600"})
    assert response.status_code == 302 and response["Location"] == secret_page
    endpoint.refresh_from_db()
    assert endpoint.secret != old and endpoint.signing_secrets() == [endpoint.secret, old]
    assert secrets_in(admin_client.get(secret_page).content.decode()) == [endpoint.secret]
    assert secrets_in(admin_client.get(secret_page).content.decode()) == []
    # As in the API: while the overlap runs, only a rotation with overlap 0 is taken.
    refused = admin_client.post(rotate, {"overlap_seconds": "600"})
    assert refused.status_code == 200 and "The previous secret signs until" in refused.content.decode()
    assert WebhookEndpoint.objects.get().secret == endpoint.secret
    assert admin_client.post(rotate, {"overlap_seconds": "0"}).status_code == 302
    newest = WebhookEndpoint.objects.get()
    assert newest.signing_secrets() == [newest.secret]
    # A rotation made after the grant: the grant was for another secret.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret="whsec_c3dhcHBlZA==")
    assert secrets_in(admin_client.get(secret_page).content.decode()) == []


def test_another_session_or_user_never_sees_a_granted_secret(admin_client, client, user, admin_user):
    admin_client.post(ADD, GOOD)
    endpoint = WebhookEndpoint.objects.get()
    secret_page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/secret/"
    client.force_login(admin_user)  # the same user, another session
    assert secrets_in(client.get(secret_page).content.decode()) == []
    assert secrets_in(admin_client.get(secret_page).content.decode()) == [endpoint.secret]


def test_the_endpoint_page_shows_its_latest_deliveries_and_links_to_all(admin_client, user):
    # An endpoint makes a delivery row per job it hears about (and per attempt):
    # its page rendered every one of them as an inline form.
    import uuid

    from jobstate.webhooks.models import WebhookDelivery

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    other = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/b")
    for i in range(60):
        WebhookDelivery.objects.create(
            endpoint=endpoint, webhook_id=f"msg_{i:03d}", event="e", job_id=uuid.uuid4()
        )
    WebhookDelivery.objects.create(endpoint=other, webhook_id="msg_other", event="e", job_id=uuid.uuid4())
    html = admin_client.get(f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert html.count('class="field-webhook_id"') == 50
    assert "msg_059" in html and "msg_010" in html and "msg_009" not in html  # the newest, newest first
    assert html.index("msg_059") < html.index("msg_010")
    assert "Showing the latest 50 of 60 deliveries." in " ".join(html.split())
    link = f"/admin/jobstate/webhookdelivery/?endpoint__id__exact={endpoint.pk}"
    assert link in html
    full = admin_client.get(link)
    assert full.status_code == 200
    assert "msg_000" in full.content.decode() and "msg_other" not in full.content.decode()
    # The total is counted up to a cap (a global endpoint's deliveries grow without bound).
    from jobstate.admin.webhooks import DeliveryInline

    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    with (
        mock.patch.object(DeliveryInline, "count_cap", 55, create=True),
        CaptureQueriesContext(connection) as queries,
    ):
        html = admin_client.get(page).content.decode()
    assert "Showing the latest 50 of more than 55 deliveries." in " ".join(html.split())
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"] and "webhookdelivery" in q["sql"]]
    assert counts and all("LIMIT 56" in sql for sql in counts), counts


def test_the_delivery_list_never_counts_or_scans_every_delivery(admin_client, user):
    # One or more rows per job an endpoint hears about: as the job list, no COUNT(*)
    # without a LIMIT and no SELECT DISTINCT over the table for the event choices.
    import uuid

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobstate.webhooks.models import WebhookDelivery

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    for event in ("job.completed", "job.failed"):
        WebhookDelivery.objects.create(endpoint=endpoint, webhook_id=event, event=event, job_id=uuid.uuid4())
    for query in ("", "?event=job.failed", "?ok__exact=0"):
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(f"/admin/jobstate/webhookdelivery/{query}")
        assert response.status_code == 200, query
        for q in queries.captured_queries:
            sql = q["sql"].upper()
            if "JOBSTATE_WEBHOOKDELIVERY" in sql:
                assert "DISTINCT" not in sql, q["sql"]
                assert "COUNT(" not in sql or "LIMIT" in sql, q["sql"]
    response = admin_client.get("/admin/jobstate/webhookdelivery/?event=job.failed")
    assert response.context["cl"].result_count == 1
    assert "?event=job.completed" in response.content.decode()  # still a choice


def test_the_delivery_list_shows_what_failed_first_and_no_long_columns(admin_client, user):
    # At 1440 px the endpoint's URL and the whole webhook-id pushed OK, the status code
    # and the duration out of the window: which delivery failed could not be seen.
    import re
    import uuid

    from jobstate.webhooks.models import WebhookDelivery

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a-long-path")
    WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id="msg_0123456789abcdef0123456789abcdef",
        event="job.failed",
        job_id=uuid.uuid4(),
        status_code=503,
        error="HTTP 503: " + "upstream unavailable " * 10,
        duration_ms=120,
    )
    html = admin_client.get("/admin/jobstate/webhookdelivery/").content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert columns[:4] == ["created_column", "ok", "status_code_column", "error_column"], columns
    assert columns[4:7] == ["event", "job_column", "endpoint_column"], columns
    cells = dict(re.findall(r'<td class="field-(\w+)">(.*?)</td>', html))
    assert "webhook_id_column" not in columns  # the job, event and attempt tell rows apart
    assert cells["error_column"].startswith("HTTP 503: upstream") and len(cells["error_column"]) == 60
    assert (cells["status_code_column"], cells["duration_column"]) == ("503", "0.1s")
    assert "a.m." not in html and "p.m." not in html  # a compact time


def test_the_delivery_and_endpoint_pages_show_times_and_durations_as_the_job_pages_do(admin_client, user):
    # "Nov. 30, 2026, 1:26 p.m.", "took 3 ms" and "Duration ms: 4", where the job pages
    # read 2026-11-30 13:26:32.757 and durations 0.3s.
    import re
    import uuid

    from jobstate.admin import display
    from jobstate.webhooks.models import WebhookDelivery

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(disabled_at=timezone.now())
    endpoint.refresh_from_db()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, webhook_id="msg_1", event="job.failed", job_id=uuid.uuid4(), duration_ms=3
    )
    cells = dict(
        re.findall(r'<td class="field-(\w+)">(.*?)</td>', admin_client.get(DELIVERIES).content.decode())
    )
    assert cells["duration_column"] == "3ms"
    page = admin_client.get(f"{DELIVERIES}{delivery.pk}/change/").content.decode()
    labels = re.findall(r"<label>([^<]*):</label>", page)
    assert "Duration ms" not in labels and labels.index("Took") < labels.index("Created at"), labels
    assert "3ms" in page and display.exact_time(delivery.created_at) in page
    page = admin_client.get(f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert "a.m." not in page and "p.m." not in page
    for moment in (endpoint.created_at, endpoint.updated_at, endpoint.disabled_at, delivery.created_at):
        assert display.exact_time(moment) in page
    assert re.search(r'<td class="field-took">\s*<p>3ms</p>', page), page


def test_the_add_endpoint_form_shows_no_value_jobstate_sets_at_the_save(admin_client):
    # It showed a "Created at" time before anything was saved.
    import re

    page = admin_client.get(ADD).content.decode()
    labels = re.findall(r"<label[^>]*>([^<]*):</label>", page)
    assert "Url" in labels and "Signing secret" in labels, labels
    for label in ("Created at", "Updated at", "Disabled at", "Consecutive failures", "Answerable"):
        assert label not in labels, label


def test_the_delivery_search_finds_a_job_or_a_message_by_an_index(admin_client, user):
    # icontains on both columns read every delivery kept: now a job id (or its first
    # digits) and a webhook-id are matched exactly, by the deliveries' indexes.
    import uuid

    from jobstate.webhooks.models import WebhookDelivery

    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    job_a, job_b = uuid.UUID("0193aaaa-0000-7000-8000-000000000001"), uuid.uuid4()
    WebhookDelivery.objects.create(endpoint=endpoint, webhook_id="msg_a", event="e", job_id=job_a)
    WebhookDelivery.objects.create(endpoint=endpoint, webhook_id="msg_b", event="e", job_id=job_b)

    def found(term: str) -> set[str]:
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get("/admin/jobstate/webhookdelivery/", {"q": term})
        assert response.status_code == 200
        for q in queries.captured_queries:
            if "jobstate_webhookdelivery" in q["sql"].lower():
                assert " LIKE " not in q["sql"].upper(), q["sql"]
        return {d.webhook_id for d in response.context["cl"].result_list}

    assert found(str(job_a)) == {"msg_a"}
    assert found(f" {str(job_b).upper()} ") == {"msg_b"}
    assert found("0193aaaa") == {"msg_a"}  # the start of an id
    assert found("msg_b") == {"msg_b"}
    assert found("msg") == set() and found("0193") == {"msg_a"}


def test_the_delivery_search_takes_what_the_job_lists_search_takes(admin_client, user, django_user_model):
    # A job's short id (as the job list and this list show it) found nothing; nor its key.
    from jobstate import services
    from jobstate.ids import short
    from jobstate.webhooks.models import WebhookDelivery

    bob = django_user_model.objects.create_user("bob")
    endpoint = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/a")
    mine = services.enqueue("test.echo", {}, owner=user, key="invoice-42")
    theirs = services.enqueue("test.echo", {}, owner=bob)
    for job in (mine, theirs):
        WebhookDelivery.objects.create(
            endpoint=endpoint, webhook_id=f"msg_{job.pk.hex}", event="e", job_id=job.pk
        )

    def found(term: str) -> set:
        response = admin_client.get(DELIVERIES, {"q": term})
        assert response.status_code == 200
        return {d.job_id for d in response.context["cl"].result_list}

    assert found(short(mine.pk)) == {mine.pk}
    assert found(short(theirs.pk).upper()) == {theirs.pk}
    assert found("invoice-42") == {mine.pk}
    assert found("BOB") == {theirs.pk}
    # The start of its id: past the time-ordered head, which two jobs made in one
    # millisecond share.
    assert found(str(mine.pk)[:30]) == {mine.pk}
    assert found("nobody") == set()


def test_the_delivery_list_links_each_rows_job_and_endpoint_without_a_query_a_row(admin_client, user):
    import uuid

    from jobstate.ids import short
    from jobstate.webhooks.models import WebhookDelivery

    def rows(n: int) -> list:
        made = []
        for i in range(n):
            endpoint = WebhookEndpoint.objects.create(owner=user, url=f"https://hooks{i}.example.com/events")
            made.append(
                WebhookDelivery.objects.create(
                    endpoint=endpoint, webhook_id=f"msg_{i}", event="e", job_id=uuid.uuid4()
                )
            )
        return made

    first = rows(1)[0]
    with CaptureQueriesContext(connection) as one:
        html = admin_client.get(DELIVERIES).content.decode()
    job = (
        f'<a href="/admin/jobstate/job/{first.job_id}/change/">'
        f'<code title="{first.job_id}">{short(first.job_id)}</code></a>'
    )
    assert job in html
    endpoint = f'<a href="/admin/jobstate/webhookendpoint/{first.endpoint_id}/change/" title="https://hooks0.example.com/events">hooks0.example.com/events</a>'
    assert endpoint in html
    rows(5)
    with CaptureQueriesContext(connection) as six:
        admin_client.get(DELIVERIES)
    assert len(six) == len(one)


def test_the_endpoint_search_finds_an_owner_by_the_user_models_own_name_field(
    admin_client, django_user_model, monkeypatch
):
    # A project's user model may name its users by another field (USERNAME_FIELD, an
    # email, say) and have no ``username`` at all: the search must not assume one.
    owner = django_user_model.objects.create_user("dora", email="dora@example.org", password="pw-dora-123")
    WebhookEndpoint.objects.create(owner=owner, url="https://hooks.example.com/dora")
    WebhookEndpoint.objects.create(url="https://hooks.example.com/global")
    monkeypatch.setattr(django_user_model, "USERNAME_FIELD", "email")
    response = admin_client.get("/admin/jobstate/webhookendpoint/", {"q": "dora@example.org"})
    assert response.status_code == 200
    assert [e.url for e in response.context["cl"].result_list] == ["https://hooks.example.com/dora"]


def test_disabled_endpoints_are_listed_with_their_reason_and_re_enabled_by_the_checkbox(admin_client, user):
    reason = "disabled after 20 failed attempts in a row; the last: HTTP 503. " + "x" * 300
    disabled = WebhookEndpoint.objects.create(
        owner=user,
        url="https://hooks.example.com/broken",
        enabled=False,
        consecutive_failures=20,
        disabled_at=timezone.now(),
        disabled_reason=reason,
    )
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/fine")
    listed = admin_client.get("/admin/jobstate/webhookendpoint/?enabled__exact=0").content.decode()
    assert "hooks.example.com/broken" in listed and "hooks.example.com/fine" not in listed
    # The start (the whole one squeezed the column to a letter a line at 1440 px).
    assert "Disabled at" in listed and reason[:59] in listed and reason[:61] not in listed
    page = f"/admin/jobstate/webhookendpoint/{disabled.pk}/change/"
    shown = admin_client.get(page).content.decode()
    assert "Tick it again, once the receiver works, to resume them" in shown and reason in shown
    response = admin_client.post(page, {**GOOD, "owner": user.pk, "url": disabled.url})
    assert response.status_code == 302, errors(response)
    disabled.refresh_from_db()
    assert disabled.enabled and disabled.consecutive_failures == 0
    assert disabled.disabled_at is None and disabled.disabled_reason == ""


def test_staff_who_see_only_their_own_endpoints_reach_no_other_secret_page(client, django_user_model, user):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("hooks-admin", password="x", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "change_webhookendpoint"])
    )
    theirs = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/alice")
    client.force_login(staff)
    for page in ("rotate-secret", "secret"):
        assert client.get(f"/admin/jobstate/webhookendpoint/{theirs.pk}/{page}/").status_code == 404
    response = client.post(
        f"/admin/jobstate/webhookendpoint/{theirs.pk}/rotate-secret/", {"overlap_seconds": 0}
    )
    assert response.status_code == 404
    assert WebhookEndpoint.objects.get().secret == theirs.secret


def test_the_admin_marks_the_endpoints_of_an_inactive_owner_as_delivering_nothing(
    admin_client, django_user_model, user
):
    # Their deliveries are skipped (jobstate.webhooks.outbox and delivery): the list and
    # the endpoint's page looked like those of any enabled endpoint.
    gone = django_user_model.objects.create_user("gone", password="x", is_active=False)
    quiet = WebhookEndpoint.objects.create(owner=gone, url="https://hooks.example.com/gone")
    heard = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/heard")
    everyone = WebhookEndpoint.objects.create(url="https://hooks.example.com/all")
    listed = admin_client.get("/admin/jobstate/webhookendpoint/")
    rows = {e.url: listed.context["cl"].model_admin.owner_column(e) for e in listed.context["cl"].result_list}
    assert rows == {
        quiet.url: "gone <strong>(owner inactive: nothing is delivered)</strong>",
        heard.url: str(user),
        everyone.url: "global (every job)",
    }
    assert listed.content.decode().count("owner inactive: nothing is delivered") == 1

    def page(endpoint: WebhookEndpoint) -> str:
        html = admin_client.get(f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/").content.decode()
        return " ".join(html.split())

    shown = page(quiet)
    assert "Owner inactive: nothing is delivered." in shown
    assert "dropped while they are, not queued for later" in shown
    assert "nothing is delivered" not in page(heard) and "Active: their jobs" in page(heard)
    assert "while the staff user who answers for it" in page(everyone)
    gone.is_active = True
    gone.save()
    assert "nothing is delivered" not in page(quiet)


class _FormFields(HTMLParser):
    """What a browser posts from a page: its named inputs (checkboxes when ticked),
    textareas and selects."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        name = found.get("name")
        if tag == "input" and name and (found.get("type") != "checkbox" or "checked" in found):
            self.data[name] = found.get("value") or ("on" if found.get("type") == "checkbox" else "")
        elif tag == "textarea" and name:
            self._textarea, self.data[name] = name, ""
        elif tag == "option" and "selected" in found and self._select:
            self.data[self._select] = found.get("value") or ""
        if tag == "select":
            self._select = name

    _select: str | None = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea] += data


def as_loaded(page: str, client: Any) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(client.get(page).content.decode())
    return {k: v for k, v in parser.data.items() if not k.startswith("_") and k != "csrfmiddlewaretoken"}


def test_an_admin_save_keeps_a_rotation_and_an_auto_disable_made_since_the_form_loaded(admin_client, user):
    # The save wrote every field back: an automatic disable (the delivery's failure count
    # reached its limit) after the form loaded was undone by the form's ticked "enabled",
    # and a rotation between the save's read and its write by the row's old secret.
    endpoint = WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", consecutive_failures=3
    )
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    body = {**as_loaded(page, admin_client), "description": "billing"}
    assert body["enabled"] == "on" and body["url"] == endpoint.url
    disabled = {"enabled": False, "consecutive_failures": 20, "disabled_reason": "disabled after 20 failures"}
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**disabled, disabled_at=timezone.now())
    rotated: list[str] = []
    clean = WebhookEndpointForm.clean

    def rotate_meanwhile(form: Any) -> Any:  # after the save's read, before its write
        read = seen.captured_queries[:]
        rotated.append(rotation.rotate(endpoint.pk, 0).secret)
        if connection.features.has_select_for_update:  # read under the lock its write keeps, as the API does
            assert any("FOR UPDATE" in q["sql"] and "jobstate_webhookendpoint" in q["sql"] for q in read)
        return clean(form)

    with (
        mock.patch.object(WebhookEndpointForm, "clean", rotate_meanwhile),
        CaptureQueriesContext(connection) as seen,
    ):
        response = admin_client.post(page, body)
    assert response.status_code == 302, errors(response)
    endpoint.refresh_from_db()
    assert endpoint.description == "billing"
    assert (endpoint.enabled, endpoint.consecutive_failures, endpoint.disabled_reason) == (
        False,
        20,
        disabled["disabled_reason"],
    )
    assert endpoint.disabled_at is not None and endpoint.secret == rotated[0]


def test_an_admin_who_ticks_enabled_re_enables_what_was_disabled_when_the_form_loaded(admin_client, user):
    endpoint = WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", enabled=False, consecutive_failures=20
    )
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    body = as_loaded(page, admin_client)
    assert "enabled" not in body
    response = admin_client.post(page, {**body, "enabled": "on"})
    assert response.status_code == 302, errors(response)
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.consecutive_failures == 0


def test_an_endpoint_given_to_another_owner_shows_them_only_the_deliveries_about_their_jobs(
    admin_client, client, django_user_model, user
):
    """An operator gave alice's endpoint to a staff user who sees only their own
    endpoints: its records of alice's jobs (her receiver's answers) stayed with it
    and showed on their endpoint page and delivery list."""
    from django.contrib.auth.models import Permission

    from jobstate.webhooks.models import WebhookDelivery

    staff = django_user_model.objects.create_user("hooks-admin", password="x", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "view_webhookdelivery"])
    )
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    WebhookDelivery.objects.create(
        endpoint=endpoint, webhook_id="msg_alice", event="job.completed", job_id=services_job(user).pk
    )
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    response = admin_client.post(page, {**as_loaded(page, admin_client), "owner": str(staff.pk)})
    assert response.status_code == 302, errors(response)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).owner_id == staff.pk
    WebhookDelivery.objects.create(
        endpoint=endpoint, webhook_id="msg_staff", event="job.completed", job_id=services_job(staff).pk
    )
    client.force_login(staff)
    html = client.get(page).content.decode()
    assert "msg_staff" in html and "msg_alice" not in html
    listed = client.get("/admin/jobstate/webhookdelivery/").context["cl"].result_list
    assert [d.webhook_id for d in listed] == ["msg_staff"]
    alices = WebhookDelivery.objects.get(webhook_id="msg_alice")
    assert client.get(f"/admin/jobstate/webhookdelivery/{alices.pk}/change/").status_code == 302
    # Staff who may see every job still see the whole history; the form says who sees what.
    html = " ".join(admin_client.get(page).content.decode().split())
    assert "msg_alice" in html and "the new owner sees only those about their own jobs" in html


def test_an_endpoint_given_to_another_owner_while_disabled_no_longer_quotes_the_previous_owners_error(
    admin_client, user, other_user
):
    """Its reason quoted the last failed delivery, about alice's job, whose record
    bob, its new owner, does not see."""
    from jobstate.webhooks import delivery

    reason = "disabled after 20 failed attempts in a row; the last: BadStatusLine: 'alice-invoice-7'. "
    endpoint = WebhookEndpoint.objects.create(
        owner=user,
        url="https://hooks.example.com/a",
        enabled=False,
        consecutive_failures=20,
        disabled_at=timezone.now(),
        disabled_reason=reason + delivery.REENABLE,
    )
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    response = admin_client.post(page, {**as_loaded(page, admin_client), "description": "billing"})
    assert response.status_code == 302, errors(response)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).disabled_reason == reason + delivery.REENABLE
    response = admin_client.post(page, {**as_loaded(page, admin_client), "owner": str(other_user.pk)})
    assert response.status_code == 302, errors(response)
    endpoint.refresh_from_db()
    # Still disabled (the receiver is the same), but bob's count starts at 0 (ownership).
    assert (endpoint.owner_id, endpoint.enabled, endpoint.consecutive_failures) == (other_user.pk, False, 0)
    assert endpoint.disabled_at is not None and endpoint.disabled_reason == delivery.OWNER_CHANGED
    assert "alice-invoice-7" not in admin_client.get(page).content.decode()


@pytest.mark.parametrize("overlap", [False, True])
def test_an_endpoint_given_to_another_owner_keeps_nothing_of_the_previous_owners(
    admin_client, user, other_user, overlap
):
    """Its failure count counted alice's deliveries (4 of 5: bob's first failure
    disabled it), and alice holds its secret (and the previous one, in an overlap),
    which signed bob's deliveries: she could sign messages his receiver trusts. The
    new secret is shown once, after the save, as a rotation's."""
    endpoint = WebhookEndpoint.objects.create(
        owner=user, url="https://hooks.example.com/a", consecutive_failures=4
    )
    if overlap:
        endpoint = rotation.rotate(endpoint.pk, 3600)
    alices = set(endpoint.signing_secrets())
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/change/"
    response = admin_client.post(page, {**as_loaded(page, admin_client), "owner": str(other_user.pk)})
    secret_page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/secret/"
    assert response.status_code == 302 and response["Location"] == secret_page
    endpoint.refresh_from_db()
    assert (endpoint.owner_id, endpoint.enabled, endpoint.consecutive_failures) == (other_user.pk, True, 0)
    assert endpoint.disabled_reason == "" and endpoint.previous_secret == ""
    assert endpoint.signing_secrets() == [endpoint.secret] and endpoint.secret not in alices
    shown = admin_client.get(secret_page).content.decode()
    assert secrets_in(shown) == [endpoint.secret]
    assert secrets_in(admin_client.get(secret_page).content.decode()) == []
    # A save that keeps the owner keeps the secret and the count.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(consecutive_failures=2)
    response = admin_client.post(page, {**as_loaded(page, admin_client), "description": "billing"})
    assert response.status_code == 302 and response["Location"] != secret_page
    kept = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert (kept.secret, kept.consecutive_failures) == (endpoint.secret, 2)


def test_deleting_an_endpoint_lists_no_delivery_of_a_previous_owners_job(
    admin_client, client, user, django_user_model
):
    """The delete confirmation (and the bulk action's) listed every delivery record the
    deletion takes, each with its event, webhook-id and attempt: those about alice's
    jobs too, to staff who see only the records of their own."""
    from django.contrib.auth.models import Permission

    from jobstate.webhooks.models import WebhookDelivery

    staff = django_user_model.objects.create_user("hooks-admin", password="x", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_webhookendpoint", "delete_webhookendpoint", "delete_webhookdelivery"]
        )
    )
    endpoint = WebhookEndpoint.objects.create(owner=staff, url="https://hooks.example.com/a")
    for webhook_id, owner in [("msg_alice", user), ("msg_staff", staff)]:
        WebhookDelivery.objects.create(
            endpoint=endpoint, webhook_id=webhook_id, event="job.completed", job_id=services_job(owner).pk
        )
    page = f"/admin/jobstate/webhookendpoint/{endpoint.pk}/delete/"
    bulk = {"action": "delete_selected", "_selected_action": [str(endpoint.pk)]}
    client.force_login(staff)
    for response in (client.get(page), client.post("/admin/jobstate/webhookendpoint/", bulk)):
        html = response.content.decode()
        assert response.status_code == 200 and "hooks.example.com/a" in html
        assert "msg_alice" not in html and "Webhook deliveries: 2" in " ".join(html.split())
    # Staff who may see every job still see each record; the deletion takes them all.
    assert "msg_alice" in admin_client.get(page).content.decode()
    assert client.post(page, {"post": "yes"}).status_code == 302
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


def test_a_superuser_makes_and_resumes_global_endpoints_and_answers_for_them(admin_client, admin_user, user):
    from jobstate.webhooks import answerable

    assert admin_client.post(ADD, GOOD).status_code == 302
    (made,) = WebhookEndpoint.objects.all()
    assert made.owner_id is None and made.answerable_id == admin_user.pk
    stopped = WebhookEndpoint.objects.create(
        owner=None,
        answerable=user,
        url="https://hooks.example.com/b",
        enabled=False,
        disabled_at=timezone.now(),
        disabled_reason=answerable.reason(user),
    )
    page = f"/admin/jobstate/webhookendpoint/{stopped.pk}/change/"
    shown = admin_client.get(page).content.decode()
    assert "while the staff user who answers for it" in shown and "alice, who answers" in shown
    body = as_loaded(page, admin_client)
    assert admin_client.post(page, body).status_code == 302  # nothing changed: nobody new answers
    stopped.refresh_from_db()
    assert stopped.answerable_id == user.pk and not stopped.enabled
    assert admin_client.post(page, {**body, "enabled": "on"}).status_code == 302
    stopped.refresh_from_db()
    assert stopped.enabled and stopped.disabled_reason == "" and stopped.answerable_id == admin_user.pk
    response = admin_client.post(page, {**as_loaded(page, admin_client), "owner": str(user.pk)})
    assert response.status_code == 302, errors(response)
    stopped.refresh_from_db()
    assert stopped.owner_id == user.pk and stopped.answerable_id is None  # its owner answers for it
