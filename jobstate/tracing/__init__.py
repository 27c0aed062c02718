"""OpenTelemetry traces for jobs (optional: ``pip install django-jobstate[tracing]``).

``install()`` registers the tracing hooks only when ``opentelemetry`` can be
imported (and the ``TRACING`` setting is not False); without the extra, nothing
of OpenTelemetry is imported and no hook is registered.
"""

from __future__ import annotations

import importlib.util


def available() -> bool:
    return importlib.util.find_spec("opentelemetry") is not None


def install() -> None:
    from jobstate import conf
    from jobstate.tracing import models  # noqa: F401  (registers JobTrace)

    if conf.get("TRACING") is False or not available():
        return
    from jobstate.tracing import spans

    spans.install()
