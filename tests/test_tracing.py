"""OpenTelemetry: one trace from the enqueueing request to the job's claim,
attempt, steps and outcome; nothing done or imported without a provider or the extra."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from jobstate import hooks, services
from jobstate.models import Job, JobEvent
from jobstate.tracing import spans
from jobstate.tracing.models import JobTrace
from jobstate.worker.runner import drain
from tests.api_support import client_for

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def exporter(monkeypatch):
    """An SDK provider exporting to memory, for this test only (the global provider
    can be set once per process; patching it keeps other tests untraced)."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield memory
    provider.shutdown()


def by_name(finished):
    return {s.name: s for s in finished}


@pytest.mark.usefixtures("fresh_cache")
def test_one_trace_holds_the_request_the_attempt_and_the_steps(exporter, user):
    tracer = trace.get_tracer_provider().get_tracer("test-web")
    with tracer.start_as_current_span("POST /api/jobs/") as request_span:
        response = client_for(user).post("/api/jobs/", {"kind": "wf.five", "parameters": {}}, format="json")
    assert response.status_code == 201
    job_id = response.data["id"]
    stored = JobTrace.objects.get(job_id=job_id)
    trace_id = request_span.get_span_context().trace_id
    assert stored.traceparent.split("-")[1] == format(trace_id, "032x")
    assert drain() == 1
    finished = exporter.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {trace_id}
    spans_ = by_name(finished)
    assert {
        "POST /api/jobs/",
        "jobstate.enqueue",
        "jobstate.claim",
        "jobstate.attempt",
        "jobstate.complete",
        *(f"jobstate.step s{i}" for i in range(1, 6)),
    } <= set(spans_)
    enqueue, attempt = spans_["jobstate.enqueue"], spans_["jobstate.attempt"]
    assert enqueue.parent.span_id == request_span.get_span_context().span_id
    assert spans_["jobstate.claim"].parent.span_id == enqueue.context.span_id
    assert attempt.parent.span_id == enqueue.context.span_id
    assert (
        attempt.attributes["jobstate.kind"] == "wf.five"
        and attempt.attributes["jobstate.outcome"] == "completed"
    )
    for i in range(1, 6):
        step = spans_[f"jobstate.step s{i}"]
        assert step.parent.span_id == attempt.context.span_id
        assert attempt.start_time <= step.start_time <= step.end_time <= attempt.end_time
    assert spans_["jobstate.complete"].parent.span_id == attempt.context.span_id


def test_the_trace_reaches_the_worker_whatever_the_global_propagator(exporter, monkeypatch, temp_handler):
    # A project whose propagator is not W3C Trace Context (B3, Jaeger, or baggage only,
    # as here): the stored traceparent is jobstate's own format, written and read as W3C.
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", W3CBaggagePropagator())
    temp_handler("test.traced", lambda ctx: None)
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request") as request_span:
        job = services.enqueue("test.traced", {})
    trace_id = request_span.get_span_context().trace_id
    assert JobTrace.objects.get(job_id=job.pk).traceparent.split("-")[1] == format(trace_id, "032x")
    drain()
    spans_ = by_name(exporter.get_finished_spans())
    assert {"jobstate.claim", "jobstate.attempt", "jobstate.complete"} <= set(spans_)
    assert {s.context.trace_id for s in spans_.values()} == {trace_id}
    assert spans_["jobstate.attempt"].parent.span_id == spans_["jobstate.enqueue"].context.span_id


def test_a_job_queued_outside_a_trace_gets_a_trace_per_attempt(exporter, temp_handler):
    def boom(ctx):
        raise ValueError("boom")

    temp_handler("test.trace_boom", boom, max_attempts=2, retry_backoff=0)
    job = services.enqueue("test.trace_boom", {})
    assert not JobTrace.objects.filter(job_id=job.pk).exists()
    drain()
    finished = exporter.get_finished_spans()
    attempts = [s for s in finished if s.name == "jobstate.attempt"]
    assert [a.attributes["jobstate.outcome"] for a in attempts] == ["retrying", "failed"]
    assert all(a.parent is None and a.status.status_code == StatusCode.ERROR for a in attempts)
    outcomes = [s for s in finished if s.name in ("jobstate.requeue", "jobstate.fail")]
    assert [o.name for o in outcomes] == ["jobstate.requeue", "jobstate.fail"]
    assert outcomes[1].status.status_code == StatusCode.ERROR
    assert [o.parent.span_id for o in outcomes] == [a.context.span_id for a in attempts]
    assert outcomes[0].context.trace_id != outcomes[1].context.trace_id
    assert "jobstate.enqueue" not in by_name(finished)


def test_transition_spans_do_not_end_before_they_start(exporter, temp_handler):
    temp_handler("test.traced", lambda ctx: time.sleep(0.01))
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        services.enqueue("test.traced", {})
    drain()
    finished = exporter.get_finished_spans()
    assert {"jobstate.claim", "jobstate.complete"} <= {s.name for s in finished}
    backwards = [(s.name, (s.end_time - s.start_time) / 1e6) for s in finished if s.end_time < s.start_time]
    assert backwards == []


def test_a_long_tracestate_is_stored_as_whole_members(exporter, temp_handler):
    """A tracestate longer than the column was cut at 512 characters: its last member
    carried a vendor's value cut short to the worker (or, cut in its key, the worker's
    extract dropped the whole list)."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    temp_handler("test.traced", lambda ctx: None)
    members = [(f"vendor{i}", "v" * 40) for i in range(20)]  # 20 x 49 characters, with commas
    incoming = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState(members),
    )
    with trace.use_span(NonRecordingSpan(incoming)):
        job = services.enqueue("test.traced", {})
    stored = JobTrace.objects.get(job_id=job.pk).tracestate
    assert stored == ",".join(f"{k}={v}" for k, v in members[:10])  # 10 x 49 - 1 = 489 <= 512
    assert spans.fitting("a=1, b=2,,c=3", limit=7) == "a=1,b=2"
    assert spans.fitting("toolongamember=1,b=2", limit=7) == ""


def test_a_failed_trace_insert_does_not_undo_the_enqueue(exporter, temp_handler, caplog):
    # The JobTrace row failed (here its table is missing: a migration not applied): the
    # error was logged, but the enqueue's transaction was left marked for rollback
    # (SQLite: the job silently not stored; PostgreSQL: aborted, the next query an error).
    temp_handler("test.traced", lambda ctx: None)
    with connection.cursor() as cursor:  # (rolled back with the test's transaction)
        cursor.execute(f"ALTER TABLE {JobTrace._meta.db_table} RENAME TO jobstate_jobtrace_gone")
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        job = services.enqueue("test.traced", {})
    assert "Tracing failed for job" in caplog.text
    assert Job.objects.filter(pk=job.pk, status="queued").exists()
    assert JobEvent.objects.filter(job_id=job.pk, transition="enqueue").exists()


def test_a_failed_trace_insert_still_ends_the_enqueue_span(exporter, temp_handler, caplog):
    temp_handler("test.traced", lambda ctx: None)
    with connection.cursor() as cursor:  # (rolled back with the test's transaction)
        cursor.execute(f"ALTER TABLE {JobTrace._meta.db_table} RENAME TO jobstate_jobtrace_gone")
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        services.enqueue("test.traced", {})
    assert "Tracing failed for job" in caplog.text
    enqueue = by_name(exporter.get_finished_spans())["jobstate.enqueue"]
    assert enqueue.status.status_code is StatusCode.ERROR
    assert enqueue.status.description.startswith("JobTrace not stored")


def test_without_a_provider_nothing_is_traced_or_queried(user):
    assert not spans.configured()
    job = services.enqueue("test.echo", {})
    with CaptureQueriesContext(connection) as queries:
        drain()
    assert not [q for q in queries.captured_queries if "jobtrace" in q["sql"].lower()]
    assert not JobTrace.objects.filter(job_id=job.pk).exists()


IMPORT_CHECK = """
import json, sys
{block}
import django
django.setup()
from jobstate import hooks
print(json.dumps({{
    "imported": sorted(m for m, mod in sys.modules.items() if m.startswith("opentelemetry") and mod),
    "spans": "jobstate.tracing.spans" in sys.modules,
    "hooks": [bool(hooks.attempt_started), bool(hooks.attempt_ended)],
}}))
"""


def _import_check(block: str, env_extra: dict[str, str] | None = None) -> dict:
    import os

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.test_settings", **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK.format(block=block)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_without_the_extra_nothing_is_imported():
    # As if opentelemetry were not installed: any import of it fails.
    result = _import_check('sys.modules["opentelemetry"] = None')
    assert result == {"imported": [], "spans": False, "hooks": [False, False]}


@pytest.mark.slow
def test_with_the_extra_the_hooks_are_installed():
    result = _import_check("")
    assert result["spans"] and result["hooks"] == [True, True]
    assert "opentelemetry.trace" in result["imported"]


@pytest.mark.slow
def test_tracing_false_turns_it_off():
    result = _import_check("", {"JOBSTATE_OVERRIDES": json.dumps({"TRACING": False})})
    assert result == {"imported": [], "spans": False, "hooks": [False, False]}


def test_hooks_are_declared_for_the_runner():
    assert isinstance(hooks.attempt_started, hooks.Hook) and isinstance(hooks.attempt_ended, hooks.Hook)


def tracing_warnings() -> list:
    from django.core.checks import run_checks

    return [m for m in run_checks(tags=["jobstate"]) if m.id == "jobstate.W012"]


def test_tracing_on_without_opentelemetry_is_a_warning(monkeypatch, settings):
    # TRACING = True promised traces that never came: install() found no
    # opentelemetry and registered nothing, without a word.
    settings.JOBSTATE = {"TRACING": True}
    assert tracing_warnings() == []  # installed: nothing to say
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if it were not installed
    (warning,) = tracing_warnings()
    assert "['TRACING'] is True" in warning.msg and "cannot be imported" in warning.msg
    assert "django-jobstate[tracing]" in warning.hint
    for value in (None, False):  # None: "when it is installed"; False: off
        settings.JOBSTATE = {"TRACING": value}
        assert tracing_warnings() == []


def _traced_failure_and_cancel(exporter, temp_handler, user) -> list:
    def decline(ctx):
        raise ValueError("card of alice@example.com declined")

    temp_handler("test.trace_decline", decline, max_attempts=1)
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        services.enqueue("test.trace_decline", {})
        other = services.enqueue("test.echo", {})
    drain(kinds=["test.trace_decline"])
    services.request_cancel(other, actor=user, reason="erasure request from alice@example.com")
    return [s for s in exporter.get_finished_spans() if s.name in ("jobstate.fail", "jobstate.cancel")]


def test_spans_carry_no_free_text_reason_or_user_name_by_default(exporter, temp_handler, user):
    # An exception message, an operator's reason and a username may hold personal data or
    # secrets; they went to the tracing backend by default (as attributes and the error status).
    cancel, fail = sorted(_traced_failure_and_cancel(exporter, temp_handler, user), key=lambda s: s.name)
    for span in (fail, cancel):
        assert "jobstate.reason" not in span.attributes
        assert "alice" not in json.dumps({**span.attributes, "status": span.status.description})
    assert fail.status.status_code is StatusCode.ERROR
    assert cancel.attributes["jobstate.actor"] == "user"
    assert fail.attributes["jobstate.actor"].startswith("worker:")


def test_tracing_sensitive_attributes_sends_them(exporter, temp_handler, user, settings):
    settings.JOBSTATE = {"TRACING_SENSITIVE_ATTRIBUTES": True}
    cancel, fail = sorted(_traced_failure_and_cancel(exporter, temp_handler, user), key=lambda s: s.name)
    assert fail.attributes["jobstate.reason"] == fail.status.description
    assert "alice@example.com declined" in fail.status.description
    assert cancel.attributes["jobstate.reason"] == "erasure request from alice@example.com"
    assert cancel.attributes["jobstate.actor"] == "user:alice"


def test_tracing_sensitive_attributes_must_be_a_bool():
    from jobstate import settings_checks

    found = settings_checks.problems({"TRACING_SENSITIVE_ATTRIBUTES": "yes"})
    assert [p.id for p in found] == ["jobstate.E003"]


def _rename(model, to: str) -> None:
    with connection.cursor() as cursor:  # (rolled back with the test's transaction)
        cursor.execute(f"ALTER TABLE {model._meta.db_table} RENAME TO {to}")


def test_a_failed_trace_read_does_not_break_the_jobs_transaction(exporter, temp_handler, caplog):
    # The stored trace was read in the caller's transaction without a savepoint: when the
    # read failed (here its table is missing), the error was logged but PostgreSQL had
    # aborted the transaction, and the job's own writes after it failed.
    temp_handler("test.traced", lambda ctx: None)
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        job = services.enqueue("test.traced", {})
    _rename(JobTrace, "jobstate_jobtrace_gone")
    with transaction.atomic():
        services.request_cancel(job, reason="no longer needed")
        Job.objects.filter(pk=job.pk).update(priority=7)
    assert "Tracing failed for job" in caplog.text
    assert Job.objects.filter(pk=job.pk, status="cancelled", priority=7).exists()
    assert JobEvent.objects.filter(job_id=job.pk, transition="cancel").exists()


def test_a_failed_step_read_does_not_break_the_jobs_transaction(exporter, temp_handler, caplog):
    from jobstate.models import JobStep

    temp_handler("test.traced", lambda ctx: None)
    with trace.get_tracer_provider().get_tracer("web").start_as_current_span("request"):
        job = services.enqueue("test.traced", {})
    _rename(JobStep, "jobstate_jobstep_gone")
    change = hooks.Transition(job.pk, "processing", "processing", "step_done", "system", "", None)
    with transaction.atomic():
        spans.on_transition(change)
        Job.objects.filter(pk=job.pk).update(priority=7)
    assert "Tracing failed for job" in caplog.text
    assert Job.objects.filter(pk=job.pk, priority=7).exists()
