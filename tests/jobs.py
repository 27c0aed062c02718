"""Handlers for the test suite, autodiscovered like any app's ``jobs.py`` so that
worker subprocesses started by the tests know them too."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

import jobstate


@jobstate.handler("test.echo", max_attempts=3, api=True)
def echo(ctx: Any) -> dict[str, Any]:
    return {"echo": ctx.parameters}


@jobstate.handler("test.limited", concurrency=2, api=True)
def limited(ctx: Any) -> None:
    return None


class SchemaParameters(serializers.Serializer):
    width = serializers.IntegerField(min_value=1, max_value=1000)
    label = serializers.CharField(max_length=50, required=False, default="")


@jobstate.handler("test.schema", schema=SchemaParameters, api=True)
def with_schema(ctx: Any) -> dict[str, Any]:
    """A handler whose parameters are validated by a DRF serializer (API tests)."""
    return {"area": ctx.parameters["width"] ** 2}


# Workflows the workflow tests run, in-process and in worker processes.
from tests import workflow_jobs as _workflow_jobs  # noqa: E402, F401

# Handlers the end-to-end tests run inside real qcluster processes.
from tests.e2e import handlers as _e2e_handlers  # noqa: E402, F401
