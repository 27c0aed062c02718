"""OpenTelemetry traces for jobs (optional: ``pip install django-jobstate[tracing]``).

``install()`` registers the tracing hooks only when ``opentelemetry`` can be
imported (and the ``TRACING`` setting is not False); without the extra, nothing
of OpenTelemetry is imported and no hook is registered.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from django.core.checks import CheckMessage, Warning, register


def available() -> bool:
    return importlib.util.find_spec("opentelemetry") is not None


def install() -> None:
    from jobstate import conf
    from jobstate.tracing import models  # noqa: F401  (registers JobTrace)

    if conf.get("TRACING") is False or not available():
        return
    from jobstate.tracing import spans

    spans.install()


@register("jobstate")
def check_tracing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``TRACING = True`` without OpenTelemetry traces nothing: say so."""
    from jobstate import conf

    # None (the default) means "when it is installed": only an explicit True is a promise.
    if conf.get("TRACING") is not True or available():
        return []
    return [
        Warning(
            "settings.JOBSTATE['TRACING'] is True but OpenTelemetry (opentelemetry-api) cannot be "
            "imported: no job is traced.",
            hint='Install the extra: pip install "django-jobstate[tracing]" (and configure a tracer '
            f"provider), or set TRACING to None or False. {conf.CHECKS_DOCS}",
            id="jobstate.W012",
        )
    ]
