"""The attempt's span ends also when django-q2's hard time limit cuts the attempt short."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from jobstate import services
from jobstate.worker.q2 import TimeoutException
from jobstate.worker.runner import run_next

pytestmark = pytest.mark.django_db


def test_the_attempt_span_ends_when_the_hard_time_limit_fires(monkeypatch: Any, temp_handler: Any) -> None:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)

    def overrun(ctx: Any) -> None:
        raise TimeoutException("Task exceeded maximum timeout value (10 seconds)")

    temp_handler("test.overrun", overrun)
    services.enqueue("test.overrun", {})
    try:
        with pytest.raises(TimeoutException):
            run_next("w-timeout")
        (attempt,) = [s for s in memory.get_finished_spans() if s.name == "jobstate.attempt"]
        assert attempt.attributes["jobstate.outcome"] == "lost"
        assert attempt.status.status_code == StatusCode.ERROR
        assert not trace.get_current_span().get_span_context().is_valid  # nothing left attached
    finally:
        provider.shutdown()
