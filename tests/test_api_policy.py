"""REST API: who may start which kind (the per-kind ``api=`` policy, GET /api/kinds/)
and who sees whom (one visibility rule; operators as a role in the history)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import Permission

import jobstate
from jobstate import registry, services
from jobstate.exceptions import UnknownKind
from jobstate.models import Job, JobEvent
from jobstate.workflows.definition import definition_of
from tests.api_support import JOBS, assert_error, client_for, failed, grant, job_url, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_cache")]

KINDS = "/api/kinds/"


# Registration -------------------------------------------------------------------


def test_the_default_policy_is_not_startable_through_the_api(temp_handler):
    temp_handler("test.plain")
    assert registry.get_handler("test.plain").api is False


@pytest.mark.parametrize("policy", [1, None, "", "run_reports", "app.", ".perm", "a b.c", ["x.y"]])
def test_a_bad_policy_is_refused_at_registration(temp_handler, policy):
    with pytest.raises(ValueError, match="api must be False, True or a permission name"):
        temp_handler("test.bad_policy", api=policy)


@pytest.mark.parametrize("options", [{"max_attemps": 5}, {"retries": 5, "time_limit": 30}])
def test_an_unknown_handler_option_is_refused_at_registration(temp_handler, options):
    # A typo was kept among the spec's options and never read: max_attempts stayed the default.
    with pytest.raises(TypeError, match=r"Handler 'test\.typo': unknown option") as raised:
        temp_handler("test.typo", **options)
    assert all(name in str(raised.value) for name in options)
    assert "the options are max_attempts, timeout" in str(raised.value)
    with pytest.raises(UnknownKind):
        registry.get_handler("test.typo")


def test_an_async_handler_is_refused_at_registration(temp_handler):
    # The worker calls a handler and stores what it returns: an `async def` one was
    # registered, then each of its jobs failed (UnstorableResult: "Object of type
    # coroutine is not JSON serializable"), its body never run.
    async def build(ctx):  # type: ignore[no-untyped-def]
        return {"rows": 1}

    async def rows(ctx):  # type: ignore[no-untyped-def]
        yield 1

    for func in (build, rows):
        with pytest.raises(TypeError, match=r"Handler 'test\.async': .*sync\.async_to_sync") as raised:
            temp_handler("test.async", func)
        assert "plain def" in str(raised.value)
        with pytest.raises(UnknownKind):
            registry.get_handler("test.async")


def test_an_unknown_workflow_option_is_refused_at_registration():
    class Typo(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx):  # type: ignore[no-untyped-def]
            return None

    try:
        with pytest.raises(TypeError, match=r"Handler 'test\.typo_flow': unknown option\(s\) max_attemps"):
            jobstate.workflow("test.typo_flow", max_attemps=2, api=True)(Typo)
    finally:
        registry.unregister("test.typo_flow")


def test_the_internal_workflow_option_is_refused_from_a_plain_handler(temp_handler):
    # workflow= is what @jobstate.workflow registers its class with: a plain handler given it
    # was taken for that workflow's (definition_of, GET /api/kinds/ "workflow": true).
    class Flow(jobstate.Workflow):
        @jobstate.step()
        def a(self, ctx):  # type: ignore[no-untyped-def]
            return None

    with pytest.raises(TypeError, match=r"Handler 'test\.not_a_flow': unknown option\(s\) workflow; the"):
        temp_handler("test.not_a_flow", workflow=Flow)
    with pytest.raises(UnknownKind):
        registry.get_handler("test.not_a_flow")
    try:  # @jobstate.workflow still registers its class
        jobstate.workflow("test.a_flow")(Flow)
        assert definition_of("test.a_flow") is Flow
    finally:
        registry.unregister("test.a_flow")


# Enqueue ------------------------------------------------------------------------


def _refusal(response, kind):  # type: ignore[no-untyped-def]
    """The response, its kind's name replaced: what tells two refusals apart."""
    headers = {k: v for k, v in response.items() if k != "Content-Length"}
    return response.status_code, headers, response.content.decode().replace(kind, "KIND")


def _answers_as_unknown(client, body):  # type: ignore[no-untyped-def]
    """``body``'s enqueue is answered exactly as the same body with a kind not registered."""
    kind = body["kind"]
    refused = client.post(JOBS, body, format="json")
    error = assert_error(refused, 400, "unknown_kind")
    assert error["message"] == f"Unknown job kind '{kind}'."
    assert error["fields"] == {"kind": [error["message"]]}
    unknown = client.post(JOBS, {**body, "kind": "test.not_registered"}, format="json")
    assert _refusal(refused, kind) == _refusal(unknown, "test.not_registered")


def test_a_kind_without_a_policy_answers_as_an_unknown_kind(user, temp_handler):
    # It was a 403 kind_not_allowed naming the kind, while a name not registered is a 400:
    # any user could probe which internal handler names exist.
    temp_handler("test.internal")
    _answers_as_unknown(client_for(user), {"kind": "test.internal"})
    assert not Job.objects.exists()


def test_the_server_log_says_why_a_registered_kind_was_refused(user, temp_handler, caplog):
    # The client cannot tell it from an unknown kind; a developer who forgot api= reads the log.
    temp_handler("test.internal")
    with caplog.at_level("INFO", logger="jobstate.api"):
        client_for(user).post(JOBS, {"kind": "test.internal"}, format="json")
        client_for(user).post(JOBS, {"kind": "test.not_registered"}, format="json")
    refused = [r.getMessage() for r in caplog.records if r.name == "jobstate.api"]
    assert len(refused) == 1 and "'test.internal'" in refused[0] and "api=" in refused[0]


def test_a_fan_out_child_cannot_be_started_through_the_api(user):
    _answers_as_unknown(client_for(user), {"kind": "wf.child", "parameters": {"n": 1}})
    assert not Job.objects.exists()


def test_an_unknown_kind_is_still_a_400(user):
    assert_error(client_for(user).post(JOBS, {"kind": "test.nope"}, format="json"), 400, "unknown_kind")


def test_a_permission_policy_needs_that_permission(user, temp_handler):
    temp_handler("test.reports", api="auth.view_group")
    _answers_as_unknown(client_for(user), {"kind": "test.reports"})
    # Staff are no exception: only the permission opens the kind.
    user.is_staff = True
    user.save()
    _answers_as_unknown(client_for(user), {"kind": "test.reports"})
    assert not Job.objects.exists()
    response = client_for(_with_perm(user, "view_group")).post(JOBS, {"kind": "test.reports"}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().kind == "test.reports"


def test_the_policy_is_checked_before_a_key_names_an_existing_job(user, temp_handler):
    temp_handler("test.keyed")
    services.enqueue("test.keyed", {}, owner=user, key="k")
    _answers_as_unknown(client_for(user), {"kind": "test.keyed", "key": "k"})
    assert Job.objects.count() == 1


@pytest.mark.parametrize("granted", [False, True])
def test_kinds_and_enqueue_agree_on_what_exists(user, temp_handler, granted):
    temp_handler("test.hidden")
    temp_handler("test.reports", api="auth.view_group")
    caller = _with_perm(user, "view_group") if granted else user
    client = client_for(caller)
    listed = {k["kind"] for k in client.get(KINDS).json()}
    assert ("test.reports" in listed) is granted
    for kind in registry.all_handlers():
        error = client.post(JOBS, {"kind": kind}, format="json").json().get("error", {})
        assert (error.get("code") == "unknown_kind") is (kind not in listed), (kind, error)


def test_owners_may_retry_only_kinds_they_may_start(user, temp_handler):
    temp_handler("test.closed", max_attempts=1)
    job = failed(user, kind="test.closed")
    client = client_for(user)
    assert "retry" not in client.get(job_url(job)).json()["allowed_actions"]
    assert_error(client.post(job_url(job, "retry/")), 403, "permission_denied")
    assert Job.objects.count() == 1
    opened = failed(user)  # test.echo: api=True
    assert "retry" in client.get(job_url(opened)).json()["allowed_actions"]
    assert client.post(job_url(opened, "retry/")).status_code == 201


def test_an_owners_retry_tells_a_closed_kind_from_a_gone_one_no_more_than_the_job_does(user, temp_handler):
    # The 403 stays (the caller sees the job, its kind included; the action is what is
    # refused), and it is the same whether the kind is registered but closed or gone.
    temp_handler("test.closed", max_attempts=1)
    closed, gone = failed(user, kind="test.closed"), failed(user)
    Job.objects.filter(pk=gone.pk).update(kind="test.gone")
    client = client_for(user)
    closed_error, gone_error = (
        assert_error(client.post(job_url(job, "retry/")), 403, "permission_denied") for job in (closed, gone)
    )
    assert closed_error == gone_error
    assert [client.get(job_url(job)).json()["allowed_actions"] for job in (closed, gone)] == [[], []]
    assert Job.objects.count() == 2


# GET /api/kinds/ -----------------------------------------------------------------


def test_kinds_lists_what_the_caller_may_start_with_parameter_schemas(user, temp_handler):
    temp_handler("test.hidden")
    temp_handler("test.reports", api="auth.view_group")
    kinds = {k["kind"]: k for k in client_for(user).get(KINDS).json()}
    assert {"test.echo", "test.schema", "test.limited"} <= set(kinds)
    assert not {"test.hidden", "test.reports", "wf.child", "e2e.slow"} & set(kinds)
    schema = kinds["test.schema"]
    assert schema["description"].startswith("A handler whose parameters are validated")
    assert schema["workflow"] is False
    params = schema["parameters"]
    assert params["type"] == "object" and params["required"] == ["width"]
    assert params["properties"]["width"] == {"type": "integer", "maximum": 1000, "minimum": 1}
    assert params["properties"]["label"]["maxLength"] == 50
    assert params["additionalProperties"] is False  # enqueue refuses any other key
    assert kinds["test.echo"]["parameters"] == {"type": "object", "additionalProperties": True}
    assert kinds["test.echo"]["max_attempts"] == 3
    # With the permission, the permission-guarded kind is listed too.
    granted = client_for(_with_perm(user, "view_group")).get(KINDS).json()
    assert "test.reports" in {k["kind"] for k in granted}


def marked_up(ctx):  # type: ignore[no-untyped-def]
    """Export the ``orders`` table of :class:`~shop.models.Order` with
    :func:`the exporter <shop.export.run>` (see `docs <https://example.org>`_).

    Rows go to ``/tmp``; :meth:`shop.export.Job.run` has the details.
    """


def test_kinds_describe_a_kind_in_plain_text(user, temp_handler):
    # The first line of the docstring, markup and all, cut where the sentence wrapped:
    # "Export the ``orders`` table of :class:`~shop.models.Order` with".
    temp_handler("test.marked_up", marked_up, api=True)
    kinds = {k["kind"]: k for k in client_for(user).get(KINDS).json()}
    assert kinds["test.marked_up"]["description"] == (
        "Export the orders table of Order with the exporter (see docs)."
    )
    schema = client_for(user).get("/api/schema/?format=json").json()
    described = schema["components"]["schemas"]["Kind"]["properties"]["description"]["description"]
    assert "first paragraph of its handler's docstring, as plain text" in described


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (None, ""),
        ("", ""),
        ("\n    Summary on the second line.\n\n    Details.\n", "Summary on the second line."),
        ("Wrapped\n    over two lines.\n\n    Details.", "Wrapped over two lines."),
        ("Run ``x`` and `y`.", "Run x and y."),
        (":func:`pkg.run`, :py:class:`~pkg.mod.Cls`, :meth:`!pkg.f`", "pkg.run, Cls, pkg.f"),
        (":ref:`the guide <guide-label>`, `Python <https://python.org>`_, `Ref`_", "the guide, Python, Ref"),
        # Left as written: not markup, or not closed.
        (
            "Takes *args and **kwargs; 2*3; a`b; ``open; at 10:30",
            "Takes *args and **kwargs; 2*3; a`b; ``open; at 10:30",
        ),
        ("``a``b and a``b``", "``a``b and a``b``"),
    ],
)
def test_a_docstring_summary_is_plain_text(doc, text):
    assert registry.summary(doc) == text


def _with_perm(user, codename):  # type: ignore[no-untyped-def]
    user.user_permissions.add(Permission.objects.get(codename=codename))
    return type(user).objects.get(pk=user.pk)


def test_kinds_inline_nested_serializers_under_defs(user, temp_handler):
    from rest_framework import serializers

    class Line(serializers.Serializer):
        sku = serializers.CharField()

    class Order(serializers.Serializer):
        lines = Line(many=True)
        mode = serializers.ChoiceField(choices=["fast", "slow"])

    temp_handler("test.order", schema=Order, api=True)
    kind = next(k for k in client_for(user).get(KINDS).json() if k["kind"] == "test.order")
    params = kind["parameters"]
    assert params["properties"]["lines"]["items"] == {"$ref": "#/$defs/Line"}
    assert params["$defs"]["Line"]["properties"]["sku"]["type"] == "string"
    assert params["additionalProperties"] is False
    assert params["$defs"]["Line"]["additionalProperties"] is False
    assert params["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert not any(key.startswith("x-spec") for key in params["properties"]["mode"])


def test_a_callable_schema_is_an_open_object(user, temp_handler):
    temp_handler("test.callable", schema=lambda p: p, api=True)
    kind = next(k for k in client_for(user).get(KINDS).json() if k["kind"] == "test.callable")
    assert kind["parameters"]["type"] == "object" and kind["parameters"]["additionalProperties"] is True


def test_kinds_needs_authentication():
    assert_error(client_for(None).get(KINDS), 401, "not_authenticated")


def test_every_demo_kind_is_startable_and_workflows_say_so(user):
    from project import etl, jobs  # noqa: F401  (the demo project's handlers)

    for name in ("demo.chart", "demo.countdown", "demo.flaky", "demo.import", "demo.etl"):
        assert registry.get_handler(name).api is True, name
    kinds = {k["kind"]: k for k in client_for(user).get(KINDS).json()}
    assert kinds["demo.etl"]["workflow"] is True
    assert kinds["demo.etl"]["parameters"]["properties"]["rows"]["maximum"] == 1_000_000
    # They were open objects, naming no parameter.
    for name, parameters in {
        "demo.countdown": {"steps", "delay"},
        "demo.flaky": {"failures", "delay"},
        "demo.import": {"rows", "delay"},
    }.items():
        assert set(kinds[name]["parameters"]["properties"]) == parameters, name
    assert kinds["demo.flaky"]["parameters"]["properties"]["failures"]["default"] == 1
    assert kinds["demo.flaky"]["description"] == (
        'Fail the first attempts, as many as the "failures" parameter says (as a flaky upstream would), '
        "then succeed."
    )


# Who sees whom --------------------------------------------------------------------


def test_owners_see_other_people_as_operator_in_the_history(user, staff_user):
    job = make_job(user)
    operator = grant(staff_user, "view_job", "cancel_job")
    response = client_for(operator).post(job_url(job, "cancel/"), {"reason": "cleanup"}, format="json")
    assert response.status_code == 200
    owner_view = client_for(user).get(job_url(job, "events/")).json()["results"]
    assert [(e["transition"], e["actor"], e["user"]) for e in owner_view] == [
        ("enqueue", "user:alice", "alice"),  # their own name
        ("cancel", "api", "operator"),
    ]
    assert "carol" not in str(owner_view)
    operator_view = client_for(operator).get(job_url(job, "events/")).json()["results"]
    assert operator_view[-1]["user"] == "carol"


def test_owners_see_their_own_name_and_a_user_label_is_hidden_too(user, staff_user):
    job = make_job(user)
    services.request_cancel(job, services.Actor.of(staff_user), "from a script")
    events = client_for(user).get(job_url(job, "events/")).json()["results"]
    assert (events[-1]["actor"], events[-1]["user"]) == ("user:operator", "operator")
    mine = make_job(user)
    client_for(user).post(job_url(mine, "cancel/"), format="json")
    assert client_for(user).get(job_url(mine, "events/")).json()["results"][-1]["user"] == "alice"
    viewer = grant(staff_user, "view_job")
    events = client_for(viewer).get(job_url(job, "events/")).json()["results"]
    assert (events[-1]["actor"], events[-1]["user"]) == ("user:carol", "carol")


def test_events_are_in_id_order_even_when_clocks_disagree(user):
    job = failed(user)
    ids = list(JobEvent.objects.filter(job=job).order_by("id").values_list("id", flat=True))
    # The last event carries the earliest time (a worker with a slow clock).
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, pk in enumerate(ids):
        JobEvent.objects.filter(pk=pk).update(created_at=base - dt.timedelta(seconds=i))
    client = client_for(user)
    assert [e["id"] for e in client.get(job_url(job, "events/")).json()["results"]] == ids
    assert [
        e["id"] for e in client.get(job_url(job, "events/"), {"ordering": "-id"}).json()["results"]
    ] == ids[::-1]
    page = client.get(job_url(job, "events/"), {"page_size": 2}).json()
    rest = client.get(page["next"]).json()["results"]
    assert [e["id"] for e in page["results"] + rest] == ids


@pytest.mark.parametrize("path", [JOBS, "/api/webhooks/", "/api/assets/", "/api/kinds/"])
def test_an_unknown_format_is_not_acceptable_not_a_missing_page(user, path):
    # DRF answers ?format=<no renderer> with a 404 "Not found." for a page that exists,
    # a status the schema does not declare (its negative tests found it).
    client = client_for(user)
    error = assert_error(client.get(path, {"format": "null"}), 406, "not_acceptable")
    assert "'null'" in error["message"] and "json" in error["message"]
    assert client.get(path, {"format": "json"}).status_code == 200


@pytest.mark.parametrize(
    "path, params, accept",
    [
        ("/api/schema/", {"format": "xml"}, "application/json"),
        ("/api/schema/", {}, "application/xml"),
        ("/api/docs/", {"format": "xml"}, "text/html"),
        ("/api/docs/", {}, "application/json"),
    ],
)
def test_the_schema_and_docs_answer_not_acceptable_in_json(path, params, accept):
    # Their 406 was rendered by the view's first renderer: YAML for the schema
    # (application/vnd.oai.openapi), "406 Not Acceptable" in HTML for the docs.
    client = client_for(None)
    assert_error(client.get(path, params, HTTP_ACCEPT=accept), 406, "not_acceptable")
    assert client.get("/api/schema/", {"format": "json"}).status_code == 200
