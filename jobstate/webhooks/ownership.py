"""What an endpoint does not keep when it changes owner: one rule for the REST API
(``is_global``) and the admin (its *Owner* field).

The endpoint itself, its URL, subscription and delivery records stay (the records
are shown by the job they are about: ``visibility``), and so does a disable (the
receiver is the same). What was the previous owner's goes:

- ``consecutive_failures`` counted failed deliveries of the previous owner's jobs:
  the new owner's first failures would have disabled the endpoint early;
- ``disabled_reason`` quoted one of them (``delivery.reason_after_owner_change``);
- the secret, and a previous one still signing, were shown to the previous owner,
  who could sign messages the new owner's receiver trusts: a new secret signs from
  the change on, shown once to whoever made the change, as a rotation's is.

Deliveries queued before the change about the previous owner's jobs send nothing:
``delivery.deliver`` checks the job's owner against the endpoint's at each attempt.
"""

from __future__ import annotations

from typing import Any

from jobstate.webhooks import delivery
from jobstate.webhooks.models import WebhookEndpoint, new_secret


def handed_over(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """The field values ``endpoint`` (as read before the change) takes when it changes
    owner; the caller saves them with the new owner, under the row lock it read it with."""
    return {
        "consecutive_failures": 0,
        "disabled_reason": delivery.reason_after_owner_change(endpoint.disabled_reason),
        "secret": new_secret(),
        "previous_secret": "",
        "previous_secret_expires_at": None,
    }
