"""Scoped throttles that are off until a rate is configured.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``, read on every
request (so ``override_settings`` works), under the scopes ``jobstate_enqueue``
(POST /jobs/) and ``jobstate`` (every other endpoint). A missing or ``None``
rate means no limit.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.throttling import ScopedRateThrottle


class JobstateThrottle(ScopedRateThrottle):
    def get_rate(self) -> str | None:
        rates = (getattr(settings, "REST_FRAMEWORK", {}) or {}).get("DEFAULT_THROTTLE_RATES") or {}
        return rates.get(self.scope)

    def allow_request(self, request: Any, view: Any) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super(ScopedRateThrottle, self).allow_request(request, view)
