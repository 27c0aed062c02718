"""Content negotiation of every jobstate API view (the schema and docs pages too)."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer


class FormatNegotiation(DefaultContentNegotiation):
    """DRF's, but a ``?format=`` that no renderer has is a 406 naming the formats
    there are, not a 404 "Not found." for a page that exists."""

    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        renderers = list(renderers)
        fitting = [renderer for renderer in renderers if renderer.format == format]
        if not fitting:
            known = ", ".join(sorted({str(renderer.format) for renderer in renderers}))
            raise NotAcceptable(f"Unknown format '{format}': use one of {known}.")
        return fitting
