"""Signed webhooks (Standard Webhooks) for job events.

``install()`` (called from ``JobstateConfig.ready``) registers the delivery
handler and the outbox hook on ``jobstate.hooks.transitioned``.
"""

from typing import Any


def install(serializer: Any) -> None:
    """Register the delivery kind and the outbox hook; ``serializer`` is the job
    serializer payloads use (the REST API's detail serializer, handed down by
    ``JobstateConfig.ready()``: the API is a higher layer)."""
    from jobstate.webhooks import delivery, outbox

    delivery.install(serializer)
    outbox.install()
