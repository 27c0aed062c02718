"""Signed webhooks: the outbox hook, the delivery handler against a real local
receiver, retries, the address guard, rotation, auto-disable and rescue."""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from jobstate import services
from jobstate.models import Job
from jobstate.webhooks import answerable, delivery, outbox, transport
from jobstate.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobstate.worker.runner import drain
from tests.webhook_support import read_in_another_thread

pytestmark = pytest.mark.django_db

ALLOW = {"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_BACKOFF_BASE": 0}


@pytest.fixture(autouse=True)
def fresh_answers():
    outbox.forget()
    yield
    outbox.forget()


def deliveries() -> list[Job]:
    return list(Job.objects.filter(kind=outbox.KIND).order_by("created_at"))


@override_settings(JOBSTATE=ALLOW)
def test_a_completed_job_is_delivered_signed_and_verifies(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    job = services.enqueue("test.echo", {"n": 7}, owner=user)
    drain()
    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request.path == "/hooks/jobs"
    assert request.headers["webhook-id"].startswith("msg_")
    assert request.headers["webhook-signature"].startswith("v1,")
    body = Webhook(endpoint.secret).verify(request.body, request.headers)
    assert body["type"] == "job.completed"
    assert body["data"]["id"] == str(job.pk)
    assert body["data"]["status"] == "completed"
    assert body["data"]["result"] == {"echo": {"n": 7}}
    assert body["data"]["owner"] == "alice"
    with pytest.raises(WebhookVerificationError):
        Webhook(WebhookEndpoint(owner=user).secret).verify(request.body, request.headers)
    (row,) = WebhookDelivery.objects.all()
    assert (row.ok, row.status_code, row.attempt, row.job_id) == (True, 200, 1, job.pk)
    assert row.webhook_id == request.headers["webhook-id"] and row.response_body == "thanks"
    (sent,) = deliveries()
    assert sent.status == "completed" and sent.result["status_code"] == 200
    assert sent.owner_id is None


@override_settings(JOBSTATE=ALLOW)
def test_a_2xx_answer_with_a_nul_is_one_delivery(user, receiver):
    # PostgreSQL's text refused the stored answer after the receiver had taken the
    # message: the delivery failed, was sent again up to every attempt, and ended failed.
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.reply = b"ok\x00"
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (sent,) = deliveries()
    assert (len(receiver.requests), sent.status) == (1, "completed"), sent.error_message
    (row,) = WebhookDelivery.objects.all()
    assert row.ok and row.response_body == "ok\ufffd"


@override_settings(JOBSTATE=ALLOW)
def test_a_stored_url_that_is_not_ascii_fails_its_delivery_once(user, receiver):
    # http.client sends ASCII only: each of the 8 attempts failed with a
    # UnicodeEncodeError, sending nothing. (The API and the admin refuse such a URL.)
    WebhookEndpoint.objects.create(owner=user, url=receiver.url + "/caf\u00e9")
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (sent,) = deliveries()
    assert sent.status == "failed" and sent.attempts == 1 and "not an ASCII URL" in sent.error_message
    assert receiver.requests == []


@override_settings(JOBSTATE=ALLOW)
def test_a_500_is_retried_with_the_same_webhook_id(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.statuses = [500]
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert len(receiver.requests) == 2
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    Webhook(endpoint.secret).verify(second.body, second.headers)
    rows = list(WebhookDelivery.objects.order_by("id").values_list("attempt", "ok", "status_code", "error"))
    assert rows == [(1, False, 500, "HTTP 500"), (2, True, 200, "")]
    (sent,) = deliveries()
    assert sent.status == "completed" and sent.attempts == 2
    endpoint.refresh_from_db()
    assert endpoint.consecutive_failures == 0 and endpoint.enabled


def test_backoff_grows_with_jitter():
    for attempt, base in [(1, 10), (3, 40)]:
        delays = {delivery.backoff(attempt) for _ in range(20)}
        assert all(base <= d <= base * 1.25 for d in delays) and len(delays) > 1


def test_backoff_of_a_late_attempt_is_the_cap():
    # 2 ** 1024 as an int overflowed the float product (OverflowError) before the cap.
    cap = delivery.backoff(2_000)
    assert 6 * 3600 <= cap <= 6 * 3600 * 1.25


def test_no_delivery_to_loopback_unless_allowed(user, receiver):
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert receiver.requests == []
    (sent,) = deliveries()
    assert sent.status == "failed" and sent.attempts == 1  # not retried
    assert "127.0.0.1 resolves to a non-public address" in sent.error_message
    (row,) = WebhookDelivery.objects.all()
    assert not row.ok and row.status_code is None and "WEBHOOK_ALLOW_PRIVATE" in row.error


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.5",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "::ffff:10.0.0.1",
        # IPv6 addresses that carry a private IPv4 one: 6to4 (2002::/16, the IPv4
        # address in bits 16-48) and NAT64 (64:ff9b::/96), and NAT64's local-use prefix.
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",
        "2002:c0a8:5::",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::5db8:d822",
        # Site-local (fec0::/10, deprecated by RFC 3879 but still routed inside some
        # networks): ipaddress counts it neither private nor reserved.
        "fec0::1",
        "feff:ffff::1",
    ],
)
def test_private_addresses_are_forbidden(address):
    assert transport.forbidden(address)


def test_public_addresses_are_allowed():
    assert not transport.forbidden("93.184.216.34") and not transport.forbidden("2606:4700::1111")
    # 6to4 and NAT64 addresses of a public IPv4 address are public.
    assert not transport.forbidden("2002:5db8:d822::1") and not transport.forbidden("64:ff9b::5db8:d822")


def test_a_name_that_resolves_to_loopback_is_refused(monkeypatch):
    monkeypatch.setattr(transport.socket, "getaddrinfo", lambda *a, **k: [(2, 1, 6, "", ("127.0.0.1", 80))])
    with pytest.raises(transport.Blocked):
        transport.post("http://innocent.example/hook", b"{}", {})


@override_settings(JOBSTATE=ALLOW)
def test_redirects_are_not_followed(user, receiver):
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.statuses = [302]
    with override_settings(JOBSTATE={**ALLOW, "WEBHOOK_MAX_ATTEMPTS": 1}):
        services.enqueue("test.echo", {}, owner=user)
        drain()
    assert len(receiver.requests) == 1
    (sent,) = deliveries()
    assert sent.status == "failed" and "HTTP 302" in sent.error_message


@override_settings(JOBSTATE=ALLOW)
def test_a_rotated_secret_signs_twice_during_the_overlap(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    old = endpoint.secret
    endpoint.previous_secret, endpoint.secret = old, WebhookEndpoint().secret
    endpoint.previous_secret_expires_at = timezone.now() + timedelta(hours=1)
    endpoint.save()
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (request,) = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(request.body, request.headers)
    Webhook(endpoint.secret).verify(request.body, request.headers)
    endpoint.previous_secret_expires_at = timezone.now() - timedelta(seconds=1)
    assert endpoint.signing_secrets() == [endpoint.secret]


@override_settings(JOBSTATE=ALLOW)
def test_a_delivery_to_an_endpoint_disabled_by_hand_is_skipped_without_a_dangling_colon(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])  # its events' deliveries are queued, not yet run
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False)  # the admin's checkbox
    drain()
    assert receiver.requests == []
    skipped = {tuple(j.result.items()) for j in Job.objects.filter(kind=outbox.KIND)}
    assert skipped == {(("skipped", "endpoint disabled"),)}


@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_DISABLE_AFTER": 3, "WEBHOOK_MAX_ATTEMPTS": 2})
def test_an_endpoint_that_keeps_failing_is_disabled_and_says_why(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    receiver.statuses = [503] * 10
    services.enqueue("test.echo", {}, owner=user)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    assert endpoint.consecutive_failures == 3 and endpoint.disabled_at is not None
    assert endpoint.disabled_reason.startswith(
        "disabled after 3 failed attempts in a row; the last: HTTP 503. "
    )
    # And what to do about it: the reason is all its owner is shown.
    assert 'PATCH {"enabled": true} on the endpoint in the webhooks API' in endpoint.disabled_reason
    assert 'tick "Enabled" on its admin page' in endpoint.disabled_reason
    assert len(receiver.requests) == 3  # the fourth attempt was skipped, not sent
    assert Job.objects.filter(kind=outbox.KIND, result__skipped__startswith="endpoint disabled").count() == 1
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert len(deliveries()) == 2  # no new delivery for a disabled endpoint


@override_settings(JOBSTATE=ALLOW)
def test_only_the_owners_and_global_endpoints_hear_of_a_job(user, other_user, admin_user, receiver):
    WebhookEndpoint.objects.create(owner=other_user, url=receiver.url + "/bob")
    WebhookEndpoint.objects.create(owner=None, answerable=admin_user, url=receiver.url + "/global")
    WebhookEndpoint.objects.create(owner=user, url=receiver.url + "/alice-etl", kinds=["etl.import"])
    services.enqueue("test.echo", {}, owner=user)
    services.enqueue("test.echo", {})  # a system job
    drain()
    assert sorted(r.path for r in receiver.requests) == ["/hooks/jobs/global", "/hooks/jobs/global"]


def test_a_delivery_commits_with_its_transition_or_not_at_all(user):
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/x")
    job = services.enqueue("test.echo", {}, owner=user)
    (claimed,) = services.claim("w", limit=1)
    token = claimed.lease_token  # the copy's is cleared by the outcome, rolled back or not
    with pytest.raises(RuntimeError), transaction.atomic():
        services.complete(claimed, token, {})
        assert len(deliveries()) == 1
        raise RuntimeError("rolled back")
    assert deliveries() == []
    services.complete(claimed, token, {})
    (queued,) = deliveries()
    assert queued.parameters["job"] == str(job.pk) and queued.parameters["event"] == "job.completed"
    assert queued.status == "queued" and queued.max_attempts == 8


def test_own_deliveries_are_never_announced(user):
    WebhookEndpoint.objects.create(
        owner=None, url="https://hooks.example.com/x", events=sorted(outbox_events())
    )
    services.enqueue("test.echo", {}, owner=user)
    (claimed,) = services.claim("w", kinds=["test.echo"], limit=1)
    services.complete(claimed, claimed.lease_token, {})
    assert len(deliveries()) == 2  # job.started, job.completed
    for _sent in deliveries():
        (d,) = services.claim("w", kinds=[outbox.KIND], limit=1)
        services.complete(d, d.lease_token, {})
    assert len(deliveries()) == 2  # the deliveries' own claims and ends queue nothing


def outbox_events() -> set[str]:
    from jobstate.webhooks.models import EVENTS

    return set(EVENTS)


def test_no_subscription_costs_no_query(user):
    job = services.enqueue("test.echo", {}, owner=user)
    (claimed,) = services.claim("w", limit=1)
    with CaptureQueriesContext(connection) as queries:
        services.complete(claimed, claimed.lease_token, {})
    assert not [q for q in queries.captured_queries if "webhook" in q["sql"]]
    assert Job.objects.get(pk=job.pk).status == "completed"
    # Saving an endpoint refreshes this process's answer at once.
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/x")
    job2 = services.enqueue("test.echo", {}, owner=user)
    services.request_cancel(job2, reason="x")
    assert [d.parameters["event"] for d in deliveries()] == ["job.cancelled"]


@override_settings(JOBSTATE=ALLOW)
def test_a_worker_killed_mid_delivery_is_rescued_with_the_same_webhook_id(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    (claimed,) = services.claim("doomed-worker", kinds=[outbox.KIND], limit=1, lease_seconds=0.2)
    claimed = services.begin(claimed, claimed.lease_token, "doomed-worker", lease_seconds=0.2).job
    # The worker sends the request, then is SIGKILLed before it stores the outcome.
    delivery.deliver(SimpleNamespace(job=claimed))
    assert len(receiver.requests) == 1
    assert Job.objects.get(pk=claimed.pk).status == "processing"
    time.sleep(0.3)  # the dead worker's lease runs out
    report = services.requeue_expired()
    assert report.requeued == [claimed.pk]
    drain()
    assert len(receiver.requests) == 2
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert json.loads(first.body)["data"]["id"] == json.loads(second.body)["data"]["id"]
    Webhook(endpoint.secret).verify(second.body, second.headers)
    sent = Job.objects.get(pk=claimed.pk)
    assert sent.status == "completed" and sent.attempts == 2


@override_settings(JOBSTATE=ALLOW)
def test_a_delivery_queued_by_a_user_is_refused(user, receiver):
    endpoint = WebhookEndpoint.objects.create(owner=None, url=receiver.url)
    job = services.enqueue("test.echo", {})
    forged = services.enqueue(
        outbox.KIND,
        {
            "endpoint": endpoint.pk,
            "job": str(job.pk),
            "event": "job.completed",
            "webhook_id": "msg_x",
            "at": "x",
        },
        owner=user,
    )
    drain(kinds=[outbox.KIND])
    forged.refresh_from_db()
    assert forged.status == "failed" and "queued by jobstate only" in forged.error_message
    assert receiver.requests == []


def test_event_types_of_transitions():
    from jobstate.hooks import Transition

    def change(frm: str, to: str, name: str) -> Transition:
        return Transition("j", frm, to, name, "x", "", None)

    assert outbox.event_type(change("", "queued", "enqueue")) is None
    assert outbox.event_type(change("queued", "processing", "claim")) == "job.started"
    assert outbox.event_type(change("processing", "queued", "requeue")) == "job.requeued"
    assert outbox.event_type(change("waiting", "queued", "wake")) == "job.requeued"
    assert outbox.event_type(change("processing", "waiting", "suspend")) is None
    assert outbox.event_type(change("processing", "completed", "complete")) == "job.completed"
    assert outbox.event_type(change("queued", "cancelled", "cancel")) == "job.cancelled"
    assert outbox.event_type(change("processing", "processing", "step_completed")) == "job.step"
    assert outbox.event_type(change("processing", "processing", "step_failed")) == "job.step"
    assert outbox.event_type(change("processing", "processing", "note")) is None


@override_settings(JOBSTATE=ALLOW)
def test_a_workflow_woken_by_its_last_child_is_announced_as_requeued(user, receiver):
    WebhookEndpoint.objects.create(owner=user, url=receiver.url, events=["job.requeued"], kinds=["wf.fan"])
    job = services.enqueue("wf.fan", {"n": 2}, owner=user)
    drain()
    job.refresh_from_db()
    assert job.status == "completed"
    bodies = [json.loads(r.body) for r in receiver.requests]
    # Waiting for its children, then back in the queue once the last one ended.
    assert [(b["type"], b["data"]["id"]) for b in bodies] == [("job.requeued", str(job.pk))]


@override_settings(JOBSTATE=ALLOW)
def test_step_events_of_a_workflow(user, receiver):
    WebhookEndpoint.objects.create(owner=user, url=receiver.url, events=["job.step", "job.completed"])
    job = services.enqueue("wf.five", {}, owner=user)
    drain()
    types = [json.loads(r.body)["type"] for r in receiver.requests]
    assert types.count("job.step") == 5 and types.count("job.completed") == 1
    assert {json.loads(r.body)["data"]["id"] for r in receiver.requests} == {str(job.pk)}


@pytest.mark.parametrize(
    ("events", "kinds"),
    [
        (5, []),
        ("job.cancelled", []),  # a string: its substrings would match
        ([{"a": 1}], []),  # unhashable
        ([1, "job.cancelled"], []),
        (["job.cancelled"], "test.echo.more"),  # "test.echo" is a substring
        (["job.cancelled"], 7),
        (["job.cancelled"], {"test.echo": 1}),
    ],
)
def test_a_malformed_stored_endpoint_is_skipped_and_logged(user, caplog, events, kinds):
    """Rows saved around the API's and the admin's checks never fail a transition
    (the outbox runs in its transaction); the well-formed endpoints still hear of it."""
    good = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/good")
    bad = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/bad")
    WebhookEndpoint.objects.filter(pk=bad.pk).update(events=events, kinds=kinds)
    outbox.forget()
    job = services.enqueue("test.echo", {}, owner=user)
    with caplog.at_level("WARNING", logger="jobstate.webhooks"):
        services.request_cancel(job, reason="x")
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    assert [(d.parameters["endpoint"], d.parameters["event"]) for d in deliveries()] == [
        (good.pk, "job.cancelled")
    ]
    assert f"webhook endpoint {bad.pk} skipped" in caplog.text


@pytest.mark.django_db(transaction=True)  # the endpoint's change commits
def test_a_reader_before_an_endpoint_change_commits_leaves_no_stale_answer(user):
    """The change drops the process's answer at once (for its own transaction) and
    again at its commit: a thread that read the old rows in between had cached them
    for WEBHOOK_CACHE_SECONDS."""
    assert outbox.wanted_events() == frozenset()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
        assert outbox.wanted_events() == frozenset(endpoint.events)
    assert outbox.wanted_events() == frozenset(endpoint.events)
    with transaction.atomic():
        endpoint.delete()
        assert read_in_another_thread() == frozenset(endpoint.events)
    assert outbox.wanted_events() == frozenset()


@pytest.mark.parametrize(
    "url", ["http://example.com:99999/", "http://example.com:0/", "http://example.com:x/", "http://[::1/"]
)
def test_a_url_without_a_valid_port_is_blocked(url):
    with pytest.raises(transport.Blocked, match="not a valid URL"):
        transport.check_url(url)


@override_settings(JOBSTATE=ALLOW)
def test_an_ipv6_url_sends_a_valid_host_header():
    # "Host: ::1:8080" (no brackets), which receivers refuse with a 400: every
    # delivery to an IPv6 address failed. A port other than the scheme's default
    # was left out too (http on 443), naming another site to a virtual host.
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hosts.append(self.headers["Host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    try:
        server = Server(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert transport.post(f"http://[::1]:{port}/hook", b"{}", {}).status == 204
    finally:
        server.shutdown()
        server.server_close()
    assert hosts == [f"[::1]:{port}"]
    assert transport.host_header("http", "example.com", 443) == "example.com:443"
    assert transport.host_header("https", "example.com", 443) == "example.com"
    assert transport.host_header("https", "2001:db8::1", 443) == "[2001:db8::1]"


@pytest.mark.django_db(transaction=True)  # the delivery row's foreign key is checked at a commit
@pytest.mark.parametrize("status, result", [(200, "status_code"), (500, "skipped")])
def test_an_endpoint_deleted_during_an_attempt_ends_the_delivery(user, monkeypatch, status, result):
    # The attempt's record then failed its foreign key: a delivered message was a failed
    # attempt (IntegrityError), retried after a backoff only to be skipped.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")

    def post(url: str, body: bytes, headers: dict[str, str]) -> transport.Response:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()  # the owner deletes it meanwhile
        return transport.Response(status, b"", 0.01)

    monkeypatch.setattr(transport, "post", post)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (sent,) = deliveries()
    assert (sent.status, sent.attempts, sent.error_message) == ("completed", 1, "")
    assert result in sent.result and not WebhookDelivery.objects.exists()


@override_settings(JOBSTATE=ALLOW)
@pytest.mark.parametrize("moved", ["job", "endpoint"])
def test_a_delivery_whose_job_or_endpoint_changed_owner_sends_nothing(user, other_user, receiver, moved):
    """The outbox picks endpoints by the job's owner as the transition commits; by the
    attempt, the job (or the endpoint) may be another user's: nothing is sent."""
    endpoint = WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    job = services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    (queued,) = deliveries()
    if moved == "job":
        Job.objects.filter(pk=job.pk).update(owner=other_user)
    else:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(owner=other_user)
    drain()
    queued.refresh_from_db()
    assert receiver.requests == [] and queued.status == "failed"
    assert "does not own this job" in queued.error_message


def test_the_connection_goes_to_the_address_that_was_checked(monkeypatch):
    """DNS rebinding: a name public when checked and loopback when asked again is
    looked up once; http and https connect to that checked address."""
    answers = {"rebind.example": ["93.184.216.34", "127.0.0.1"]}
    looked_up: list[str] = []
    connected: list[tuple[str, int]] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        looked_up.append(host)
        address = answers[host][min(len(looked_up), 2) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def create_connection(address, *args, **kwargs):
        connected.append(address)
        raise ConnectionRefusedError("not really connecting")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    for url, port in [("http://rebind.example/hook", 80), ("https://rebind.example/hook", 443)]:
        looked_up.clear()
        connected.clear()
        with pytest.raises(ConnectionRefusedError):
            transport.post(url, b"{}", {})
        assert looked_up == ["rebind.example"] and connected == [("93.184.216.34", port)]


@override_settings(JOBSTATE=ALLOW)
def test_an_address_that_takes_no_connection_is_followed_by_the_next(user, receiver, monkeypatch):
    """A name with several addresses (an IPv6 one this server cannot reach, a node
    down) was tried at its first only: every attempt failed, as a browser or curl
    would not. The checked addresses are tried in turn, as create_connection does."""
    port = int(receiver.url.split(":")[2].split("/")[0])
    infos = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in ("127.0.0.9", "127.0.0.1")]
    real_lookup, real_connect = socket.getaddrinfo, socket.create_connection
    tried: list[str] = []

    def create_connection(address, *args, **kwargs):
        tried.append(address[0])
        if address[0] == "127.0.0.9":
            raise OSError(101, "Network is unreachable")
        return real_connect(address, *args, **kwargs)

    def lookup(host, *args, **kwargs):
        # Each address twice (one per protocol, as getaddrinfo may give): tried once.
        return infos + infos if host == "two.example" else real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    WebhookEndpoint.objects.create(owner=user, url=f"http://two.example:{port}/hook")
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (sent,) = deliveries()
    assert sent.status == "completed" and tried == ["127.0.0.9", "127.0.0.1"]
    assert [(r.path, r.headers["host"]) for r in receiver.requests] == [("/hook", f"two.example:{port}")]
    tried.clear()
    with pytest.raises(OSError, match="unreachable"):  # none takes it: the last one's error
        transport.connect(["127.0.0.9"], port, time.monotonic() + 5)
    assert tried == ["127.0.0.9"]


def fake_dns(monkeypatch, answers: dict[str, str]) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_refused_name_does_not_tell_its_owner_the_address(user, monkeypatch, caplog):
    """The stored error is the owner's to read (API, admin, disabled_reason): naming
    the address made the server's DNS an oracle for internal names. The log has it."""
    fake_dns(monkeypatch, {"intranet.example": "10.20.30.40"})
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://intranet.example/hook")
    services.enqueue("test.echo", {}, owner=user)
    with caplog.at_level("WARNING", logger="jobstate.webhooks"):
        drain()
    (row,) = WebhookDelivery.objects.all()
    assert row.error == "intranet.example resolves to a non-public address; see WEBHOOK_ALLOW_PRIVATE"
    (sent,) = deliveries()
    assert sent.status == "failed" and "10.20.30.40" not in sent.error_message + sent.traceback
    with override_settings(JOBSTATE={"WEBHOOK_DISABLE_AFTER": 1}):
        services.enqueue("test.echo", {}, owner=user)
        drain()
    endpoint.refresh_from_db()
    assert not endpoint.enabled and "10.20.30.40" not in endpoint.disabled_reason
    assert "intranet.example" in caplog.text and "10.20.30.40" in caplog.text


@pytest.mark.parametrize(
    ("raised", "stored"),
    [
        (OSError(113, "No route to host", "10.0.0.7"), "OSError: No route to host"),
        (ConnectionRefusedError(111, "Connection refused"), "ConnectionRefusedError: Connection refused"),
        (TimeoutError("timed out connecting to 10.0.0.7"), "TimeoutError: timed out"),
        (socket.gaierror(-2, "Name or service not known"), "gaierror: Name or service not known"),
        (RuntimeError("proxy at 10.0.0.7:3128 refused"), "RuntimeError (details in the server's log)"),
    ],
)
def test_a_failed_connection_stores_no_server_details(user, monkeypatch, caplog, raised, stored):
    def create_connection(*args, **kwargs):
        raise raised

    fake_dns(monkeypatch, {"hooks.example": "93.184.216.34"})
    monkeypatch.setattr(socket, "create_connection", create_connection)
    WebhookEndpoint.objects.create(owner=user, url="https://hooks.example/hook")
    services.enqueue("test.echo", {}, owner=user)
    with (
        override_settings(JOBSTATE={"WEBHOOK_MAX_ATTEMPTS": 1}),
        caplog.at_level("WARNING", logger="jobstate.webhooks"),
    ):
        drain()
    (row,) = WebhookDelivery.objects.all()
    assert row.error == stored
    (sent,) = deliveries()
    assert sent.status == "failed" and sent.error_message == stored
    if isinstance(raised, RuntimeError):
        assert "10.0.0.7:3128" in caplog.text


@override_settings(JOBSTATE={**ALLOW, "WEBHOOK_MAX_ATTEMPTS": 1})
def test_a_tls_error_is_stored_without_the_librarys_source_line(user, receiver):
    # https to a plain http receiver: the handshake fails.
    WebhookEndpoint.objects.create(owner=user, url=receiver.url.replace("http:", "https:"))
    services.enqueue("test.echo", {}, owner=user)
    drain()
    (row,) = WebhookDelivery.objects.all()
    assert row.error.startswith("TLS error: [SSL: ") and "_ssl.c" not in row.error, row.error


def test_dns_and_certificate_errors_say_what_went_wrong(monkeypatch):
    from jobstate.webhooks import errors

    def getaddrinfo(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(transport.Unresolvable) as raised:
        transport.post("https://nowhere.invalid/hook", b"{}", {})
    assert (
        errors.public(raised.value)
        == "Unresolvable: cannot resolve nowhere.invalid: Name or service not known"
    )
    verify = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed (_ssl.c:1006)"
    )
    verify.verify_message = "self-signed certificate"
    assert errors.public(verify) == "TLS certificate not accepted: self-signed certificate"


@override_settings(JOBSTATE=ALLOW)
def test_an_inactive_users_endpoints_hear_nothing_until_active_again(user, admin_user, receiver):
    """A user made inactive (is_active false) kept receiving events about their
    jobs. Staff's global endpoints still hear of every job."""
    WebhookEndpoint.objects.create(owner=user, url=receiver.url + "/own")
    WebhookEndpoint.objects.create(owner=None, answerable=admin_user, url=receiver.url + "/global")
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert [r.path for r in receiver.requests] == ["/hooks/jobs/global"]
    assert len(deliveries()) == 1
    type(user).objects.filter(pk=user.pk).update(is_active=True)
    receiver.requests.clear()
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert sorted(r.path for r in receiver.requests) == ["/hooks/jobs/global", "/hooks/jobs/own"]


@override_settings(JOBSTATE=ALLOW)
def test_a_delivery_queued_before_its_owner_was_made_inactive_sends_nothing(user, receiver):
    WebhookEndpoint.objects.create(owner=user, url=receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    (queued,) = deliveries()
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    drain()
    queued.refresh_from_db()
    assert receiver.requests == [] and not WebhookDelivery.objects.exists()
    assert queued.status == "completed" and queued.result == {"skipped": delivery.OWNER_INACTIVE}


def test_a_user_model_without_is_active_keeps_its_users_endpoints(monkeypatch):
    # AbstractBaseUser's is_active is a class attribute; a custom model may store none,
    # and a filter on owner__is_active would fail every transition (a FieldError).
    from django.db.models import Q

    monkeypatch.setattr(outbox, "get_user_model", lambda: WebhookDelivery)
    assert outbox.listeners(7) == Q(owner__isnull=True) | Q(owner_id=7)
    assert outbox.listeners(None) == Q(owner__isnull=True)


@override_settings(JOBSTATE={"WEBHOOK_DISABLE_AFTER": 1})
def test_a_long_last_error_leaves_how_to_re_enable_whole(user):
    # The reason was cut at 2000 characters from the end, which would take the part
    # saying how to resume deliveries after a long error.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    record = WebhookDelivery(
        endpoint=endpoint, webhook_id="msg_1", event="job.completed", job_id=uuid.uuid4()
    )
    assert delivery._failed(record, endpoint, "BadStatusLine: " + "x" * 3000, time.monotonic())
    endpoint.refresh_from_db()
    assert not endpoint.enabled and len(endpoint.disabled_reason) < 2000
    assert endpoint.disabled_reason.startswith(
        "disabled after 1 failed attempts in a row; the last: BadStatusLine: xx"
    )
    assert endpoint.disabled_reason.endswith(delivery.REENABLE)
    assert endpoint.disabled_reason.endswith("Fix the receiver first.")


@override_settings(JOBSTATE={"WEBHOOK_DISABLE_AFTER": 1})
def test_an_attempt_that_fails_after_its_endpoint_changed_owner_does_not_quote_its_error(user, other_user):
    # The attempt began under alice (about her job) and failed once the endpoint was
    # bob's: its error went into the reason bob reads, about a record he does not see.
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    record = WebhookDelivery(
        endpoint=endpoint, webhook_id="msg_1", event="job.completed", job_id=uuid.uuid4()
    )
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(owner=other_user)
    assert delivery._failed(record, endpoint, "BadStatusLine: 'alice-invoice-7'", time.monotonic())
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_at is not None
    assert endpoint.disabled_reason == delivery.OWNER_CHANGED
    # Without a change of owner (a global endpoint's too), the reason quotes the error.
    for owner in (other_user, None):
        endpoint = WebhookEndpoint.objects.create(owner=owner, url="https://hooks.example.com/b")
        record = WebhookDelivery(
            endpoint=endpoint, webhook_id="msg_2", event="job.completed", job_id=uuid.uuid4()
        )
        assert delivery._failed(record, endpoint, "HTTP 500", time.monotonic())
        endpoint.refresh_from_db()
        assert not endpoint.enabled and "the last: HTTP 500" in endpoint.disabled_reason


def make_global(maker, url):  # type: ignore[no-untyped-def]
    from tests.api_support import client_for

    made = client_for(maker).post("/api/webhooks/", {"url": url, "is_global": True}, format="json")
    assert made.status_code == 201 and made.data["owner"] is None
    assert made.data["answerable"] == maker.get_username()
    return WebhookEndpoint.objects.get(pk=made.data["id"])


def demote_by_deactivating(staff):  # type: ignore[no-untyped-def]
    type(staff).objects.filter(pk=staff.pk).update(is_active=False)


def demote_by_taking_staff(staff):  # type: ignore[no-untyped-def]
    type(staff).objects.filter(pk=staff.pk).update(is_staff=False)


def demote_by_taking_the_permission(staff):  # type: ignore[no-untyped-def]
    staff.user_permissions.clear()


def demote_by_deleting(staff):  # type: ignore[no-untyped-def]
    staff.delete()


@override_settings(JOBSTATE=ALLOW)
@pytest.mark.parametrize(
    "demote",
    [demote_by_deactivating, demote_by_taking_staff, demote_by_taking_the_permission, demote_by_deleting],
)
def test_a_global_endpoint_stops_once_who_answers_for_it_may_not_view_every_job(
    user, staff_user, receiver, demote
):
    """A global endpoint kept sending every job's payload after the staff user who made
    it was made inactive, no longer staff, lost jobstate.view_job or was deleted."""
    from tests.api_support import grant

    endpoint = make_global(grant(staff_user, "view_job"), receiver.url)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert len(receiver.requests) == 1
    services.enqueue("test.echo", {}, owner=user)
    drain(kinds=["test.echo"])
    demote(staff_user)
    drain()
    assert len(receiver.requests) == 1
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_at is not None
    assert endpoint.disabled_reason.startswith("disabled: ")
    assert endpoint.disabled_reason.endswith(answerable.RESUME)
    assert ("carol, who answers" in endpoint.disabled_reason) == (demote is not demote_by_deleting)
    skipped = deliveries()[-1]
    assert skipped.status == "completed"
    # Its reason once, without its own "disabled: " (it read "endpoint disabled: disabled: ...").
    assert skipped.result == {
        "skipped": f"endpoint disabled: {endpoint.disabled_reason.removeprefix('disabled: ')}"
    }
    # Disabled: the next events queue nothing.
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert len(receiver.requests) == 1 and len(deliveries()) == 2


@override_settings(JOBSTATE=ALLOW)
def test_whoever_enables_a_stopped_global_endpoint_again_answers_for_it(
    user, staff_user, admin_user, receiver
):
    from tests.api_support import client_for, grant

    endpoint = make_global(grant(staff_user, "view_job"), receiver.url)
    demote_by_deactivating(staff_user)
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert receiver.requests == []
    resumed = client_for(admin_user).patch(f"/api/webhooks/{endpoint.pk}/", {"enabled": True}, format="json")
    assert resumed.status_code == 200, resumed.data
    assert resumed.data["answerable"] == admin_user.get_username() and resumed.data["disabled_reason"] == ""
    services.enqueue("test.echo", {}, owner=user)
    drain()
    assert len(receiver.requests) == 1


def test_a_stop_does_not_undo_a_new_answer(user, staff_user, admin_user):
    # Read while carol answered for it; admin took it over (and enabled it) before the
    # delivery wrote: the endpoint stays enabled.
    endpoint = WebhookEndpoint.objects.create(
        owner=None, answerable=staff_user, url="https://hooks.example.com/a"
    )
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answerable=admin_user)
    assert answerable.lapsed(endpoint)
    assert "carol" in answerable.stop(endpoint)
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.disabled_reason == ""


def test_an_owners_endpoint_answers_to_its_owner_only(user, staff_user):
    endpoint = WebhookEndpoint.objects.create(owner=user, url="https://hooks.example.com/a")
    assert not answerable.lapsed(endpoint)
    with pytest.raises(IntegrityError), transaction.atomic():
        WebhookEndpoint.objects.create(owner=user, answerable=staff_user, url="https://hooks.example.com/b")


def test_a_stopped_global_endpoint_given_an_owner_does_not_name_who_answered(staff_user):
    from jobstate.webhooks import ownership

    endpoint = WebhookEndpoint.objects.create(owner=None, url="https://hooks.example.com/a")
    endpoint.disabled_reason = answerable.reason(staff_user)
    assert "carol" in endpoint.disabled_reason
    assert ownership.handed_over(endpoint)["disabled_reason"] == answerable.HANDED_OVER


def test_the_migration_disables_with_the_reason_of_no_one_answering():
    from importlib import import_module

    migration = import_module("jobstate.migrations.0025_webhook_answerable")
    assert answerable.reason(None) == migration.NO_ONE
