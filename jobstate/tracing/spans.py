"""The spans: imported only when ``opentelemetry`` is installed.

- ``jobstate.enqueue`` (a child of the span current where the job was queued, e.g.
  the web request); its W3C ``traceparent`` is stored with the job (``JobTrace``,
  in the enqueue's transaction) when the enqueue happens inside a trace;
- ``jobstate.claim``, ``jobstate.attempt`` (the handler's run; the handler's own
  spans nest in it), ``jobstate.step <name>`` for each workflow step that ends,
  and one span per outcome (``jobstate.complete``, ``jobstate.fail``, ...), all in
  the stored trace.

Nothing happens (and no query runs) unless a real tracer provider is configured
(``opentelemetry-sdk`` or another implementation). Errors are logged, never
raised: the hooks run inside the job's transactions, so every query is made in a
savepoint there (``_isolated``): one that fails (PostgreSQL then aborts the whole
transaction) is rolled back alone and the job's own writes go on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobstate import conf, hooks

logger = logging.getLogger("jobstate.tracing")
SCOPE = "jobstate"
FAILED = {"fail", "step_failed"}
# JobTrace stores a W3C traceparent whatever the global propagator is (B3, Jaeger...
# write other keys, and nothing would be stored or read back).
W3C = TraceContextTextMapPropagator()
# JobTrace.tracestate's length: W3C asks a vendor to pass on at least 512 characters.
TRACESTATE_LIMIT = 512


def configured() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer() -> trace.Tracer:
    return trace.get_tracer_provider().get_tracer(SCOPE)


def _ns(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1e9) if moment is not None else None


@dataclass
class _Attempt:
    job_id: Any
    span: trace.Span
    token: object


_local = threading.local()


@contextmanager
def _isolated() -> Iterator[None]:
    """A savepoint when inside the caller's transaction (a failed query must not abort
    it: PostgreSQL refuses every later statement, so the job's own write would fail or
    be rolled back); nothing in autocommit, where a failed statement breaks nothing."""
    if connection.in_atomic_block:
        with transaction.atomic():
            yield
    else:
        yield


def _attempt(job_id: Any) -> _Attempt | None:
    current = getattr(_local, "attempt", None)
    return current if current is not None and str(current.job_id) == str(job_id) else None


def stored_context(job_id: Any) -> otel_context.Context | None:
    from jobstate.tracing.models import JobTrace

    with _isolated():
        row = JobTrace.objects.filter(job_id=job_id).values_list("traceparent", "tracestate").first()
    if row is None:
        return None
    carrier = {"traceparent": row[0]}
    if row[1]:
        carrier["tracestate"] = row[1]
    return W3C.extract(carrier)


def _parent(job_id: Any) -> otel_context.Context | None:
    """This thread's attempt of the job, else the trace stored at enqueue."""
    attempt = _attempt(job_id)
    if attempt is not None:
        return trace.set_span_in_context(attempt.span)
    return stored_context(job_id)


def on_transition(change: hooks.Transition) -> None:
    if not configured():
        return
    try:
        _on_transition(change)
    except Exception:
        logger.exception("Tracing failed for job %s (%s)", change.job_id, change.transition)


def _actor(label: str, sensitive: bool) -> str:
    # A username is personal data: the backend learns only that a user acted.
    return "user" if label.startswith("user:") and not sensitive else label


def _on_transition(change: hooks.Transition) -> None:
    sensitive = conf.get("TRACING_SENSITIVE_ATTRIBUTES") is True
    attributes = {
        "jobstate.job_id": str(change.job_id),
        "jobstate.transition": change.transition,
        "jobstate.from_status": change.from_status or "none",
        "jobstate.to_status": change.to_status,
        "jobstate.actor": _actor(change.actor_label, sensitive),
    }
    if change.transition == "enqueue":
        if not trace.get_current_span().get_span_context().is_valid:
            return  # queued outside any trace: the worker starts one per attempt
        span = _tracer().start_span("jobstate.enqueue", kind=SpanKind.PRODUCER, attributes=attributes)
        carrier: dict[str, str] = {}
        W3C.inject(carrier, context=trace.set_span_in_context(span))
        from jobstate.tracing.models import JobTrace

        try:
            if "traceparent" in carrier:
                # In a savepoint: a failed insert (logged by on_transition) must not undo
                # the enqueue, which Django's atomic would roll back (PostgreSQL aborts it).
                with _isolated():
                    JobTrace.objects.create(
                        job_id=change.job_id,
                        traceparent=carrier["traceparent"][:55],
                        tracestate=fitting(carrier.get("tracestate", "")),
                    )
        except Exception as error:
            span.set_status(StatusCode.ERROR, f"JobTrace not stored: {type(error).__name__}")
            raise
        finally:
            span.end()  # exported whatever happened
        return
    parent = _parent(change.job_id)
    if parent is None:
        return
    name, start = f"jobstate.{change.transition}", None
    if change.transition.startswith("step_"):
        step, start = _step(change.job_id)
        name = f"jobstate.step {step}"
        attributes["jobstate.step"] = step
    # Free text (exception messages, operators' reasons) may hold personal data or secrets.
    reason = change.reason[:500] if sensitive else ""
    if reason:
        attributes["jobstate.reason"] = reason
    # A transition is a moment (a step's span runs from the step's start): never
    # end a span before its start, which an exporter would show as a negative duration.
    end = _ns(change.at)
    start = start if start is not None else end
    if start is not None and end is not None:
        end = max(start, end)
    span = _tracer().start_span(name, context=parent, attributes=attributes, start_time=start)
    if change.transition in FAILED:
        span.set_status(StatusCode.ERROR, reason or None)
    span.end(end_time=end)


def fitting(tracestate: str, limit: int = TRACESTATE_LIMIT) -> str:
    """The first members of a W3C ``tracestate`` list that fit in ``limit`` characters,
    each whole: cut at the limit, the last member kept part of a vendor's value (or,
    cut in its key, made the whole list invalid, dropped by the worker's extract)."""
    kept = ""
    for member in filter(None, (part.strip() for part in tracestate.split(","))):
        joined = f"{kept},{member}" if kept else member
        if len(joined) > limit:
            break  # the most recent first (W3C): the later ones go
        kept = joined
    return kept


def _step(job_id: Any) -> tuple[str, int | None]:
    """The step that just ended (the last one written) and when it started."""
    from jobstate.models import JobStep

    with _isolated():
        row = (
            JobStep.objects.filter(job_id=job_id, finished_at__isnull=False)
            .order_by("-updated_at", "-position")
            .values_list("name", "started_at")
            .first()
        )
    return (row[0], _ns(row[1])) if row else ("?", None)


def attempt_started(ctx: Any) -> None:
    if not configured():
        return
    try:
        previous = getattr(_local, "attempt", None)
        if previous is not None:  # an attempt that never ended (the runner was interrupted)
            _end(previous, "lost")
        job = ctx.job
        parent = stored_context(job.pk)
        span = _tracer().start_span(
            "jobstate.attempt",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "jobstate.job_id": str(job.pk),
                "jobstate.kind": job.kind,
                "jobstate.attempt": job.attempts,
                "jobstate.worker": ctx.worker_id,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        _local.attempt = _Attempt(job.pk, span, token)
    except Exception:
        logger.exception("Tracing failed at the start of an attempt")


def attempt_ended(ctx: Any, outcome: str) -> None:
    attempt = _attempt(ctx.job.pk)
    if attempt is None:
        return
    try:
        _end(attempt, outcome)
    except Exception:
        logger.exception("Tracing failed at the end of an attempt")


def _end(attempt: _Attempt, outcome: str) -> None:
    _local.attempt = None
    attempt.span.set_attribute("jobstate.outcome", outcome)
    if outcome in ("failed", "retrying", "lost"):
        attempt.span.set_status(StatusCode.ERROR, outcome)
    try:
        otel_context.detach(attempt.token)  # type: ignore[arg-type]
    finally:
        attempt.span.end()


def install() -> None:
    # Only an enqueue inside a trace stores something (its JobTrace row).
    hooks.transitioned.register(on_transition, writes=lambda change: change.transition == "enqueue")
    hooks.attempt_started.register(attempt_started)
    hooks.attempt_ended.register(attempt_ended)
