"""Content negotiation of every jobstate API view (the schema and docs pages too)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class FormatNegotiation(DefaultContentNegotiation):
    """DRF's, but a ``?format=`` that no renderer has is a 406 naming the formats
    there are, not a 404 "Not found." for a page that exists."""

    def filter_renderers(self, renderers: list[Any], format: str) -> list[Any]:
        fitting = [renderer for renderer in renderers if renderer.format == format]
        if not fitting:
            known = ", ".join(sorted({renderer.format for renderer in renderers}))
            raise NotAcceptable(f"Unknown format '{format}': use one of {known}.")
        return fitting
