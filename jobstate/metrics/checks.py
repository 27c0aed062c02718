"""System check (``manage.py check``) of the metrics settings: ``METRICS_ACCESS = "token"``
with no ``METRICS_TOKEN`` refuses every scrape."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register

from jobstate import conf


@register("jobstate")
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if not conf.well_typed("METRICS_ACCESS", "METRICS_TOKEN"):
        return []  # a wrong type is E003's
    if conf.get("METRICS_ACCESS") != "token" or conf.get("METRICS_TOKEN").strip():
        return []
    return [
        Error(
            "settings.JOBSTATE['METRICS_ACCESS'] is 'token' but JOBSTATE['METRICS_TOKEN'] is empty: "
            "/metrics/ refuses every request.",
            hint="Set JOBSTATE['METRICS_TOKEN'] to a long random secret (from the environment, say) and give "
            f"it to the scraper as a Bearer token, or use METRICS_ACCESS 'staff'. {conf.CHECKS_DOCS}",
            id="jobstate.E007",
        )
    ]
