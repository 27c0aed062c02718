"""Which delivery records a reader sees: those about jobs the reader may see.

An endpoint's owner can change (an operator's edit in the admin, the API's
``is_global``) and its records stay with it, some about the previous owner's jobs
(their ids, the receiver's answers). So a record is shown by the job it is about,
as the job itself is: to those who may see every job, all of them; to anyone
else, those about their own jobs, judged from the job row when read (a record
about a job deleted since is not shown to them), not from who owned the endpoint
when it was written.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from jobstate.models import Job
from jobstate.models.job import may_view_all
from jobstate.webhooks.models import WebhookDelivery


def seen_by(deliveries: QuerySet[WebhookDelivery], user: Any) -> QuerySet[WebhookDelivery]:
    """``deliveries`` narrowed to those ``user`` may read."""
    if may_view_all(user):
        return deliveries
    pk = getattr(user, "pk", None)
    if pk is None:  # owner_id=None would match the system jobs' deliveries
        return deliveries.none()
    # A primary-key probe per record read: the lists walk the records newest first.
    theirs = Job.objects.filter(pk=OuterRef("job_id"), owner_id=pk)
    return deliveries.filter(Exists(theirs))
