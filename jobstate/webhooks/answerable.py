"""Who answers for a global endpoint, and stopping one that no one may answer for.

A global endpoint hears about every job: it is a staff user's right to see every
job (``may_view_all``) lent to a receiver. So it records the staff user who made it
global or last changed it (``WebhookEndpoint.answerable``, set by the REST API and
the admin), and each delivery checks that this user still may view every job (read
with the endpoint; ``has_perm`` costs the auth backend's permission reads for staff
who are not superusers). When they may not (made inactive, no longer staff, the
permission gone, deleted), the endpoint is disabled with a reason that says how to
resume it: enabling it again makes whoever does it answerable.

An owner's endpoint is answered for by its owner, who always may see their own
jobs while active (``outbox.listeners`` and ``delivery.deliver`` judge that).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from jobstate.models.job import may_view_all
from jobstate.webhooks import cache
from jobstate.webhooks.models import WebhookEndpoint

RESUME = (
    "Deliveries resume once staff who may view every job enable it again, who then answer for it: "
    'PATCH {"enabled": true} on the endpoint in the webhooks API, or tick "Enabled" on its admin page.'
)
# The start of every reason written here (``handed_over`` tells them apart by it).
PREFIX = "disabled: "

# The reason an endpoint keeps when it is given an owner (the reason above named a
# staff user the new owner need not know of).
HANDED_OVER = (
    "disabled while it was global, as no one who may view every job answered for it. Deliveries "
    'resume once it is enabled again: PATCH {"enabled": true} on the endpoint in the webhooks API, '
    'or tick "Enabled" on its admin page.'
)


def for_editor(owner: Any, editor: Any) -> Any:
    """Who answers for an endpoint that ``editor`` saves with ``owner``: the editor
    for a global one, nobody (its owner does) for an owner's."""
    return editor if owner is None else None


def lapsed(endpoint: WebhookEndpoint) -> bool:
    """Whether ``endpoint`` is global and nobody answers for it who may view every
    job (read ``select_related("answerable")``)."""
    return endpoint.owner_id is None and not may_view_all(endpoint.answerable)


def reason(user: Any) -> str:
    """The ``disabled_reason`` of a global endpoint ``user`` no longer answers for."""
    if user is None:
        why = (
            "no one answers for this global endpoint, which hears about every job (it was made "
            "before jobstate recorded who answers for one, or that user was deleted)"
        )
    else:
        why = (
            f"{user.get_username()}, who answers for this global endpoint, may no longer view every "
            "job (inactive, not staff, or without jobstate.view_job), and it hears about every job"
        )
    return f"{PREFIX}{why}. {RESUME}"


def stop(endpoint: WebhookEndpoint) -> str:
    """Disable ``endpoint`` (``lapsed``), unless someone answered for it or disabled
    it meanwhile; returns the reason."""
    why = reason(endpoint.answerable)
    stopping = WebhookEndpoint.objects.filter(
        pk=endpoint.pk, owner__isnull=True, enabled=True, answerable=endpoint.answerable_id
    )
    if stopping.update(enabled=False, disabled_at=timezone.now(), disabled_reason=why):
        cache.changed(stopping.db)  # a queryset update, without the model's save
    return why


def after_owner_change(disabled_reason: str) -> str | None:
    """The reason a global endpoint stopped here keeps when given an owner; None
    for any other reason."""
    return HANDED_OVER if disabled_reason.startswith(PREFIX) else None
