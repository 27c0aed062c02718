"""The jobstate admin: the job list, job page, operator actions, stuck jobs,
dashboard and assets. Importing this package registers the ModelAdmins."""

from jobstate.admin.assets import AssetAdmin
from jobstate.admin.events import JobEventAdmin
from jobstate.admin.jobs import JobAdmin
from jobstate.admin.pauses import KindPauseAdmin
from jobstate.admin.webhooks import WebhookDeliveryAdmin, WebhookEndpointAdmin
from jobstate.admin.workers import WorkerProcessAdmin

__all__ = [
    "AssetAdmin",
    "JobAdmin",
    "JobEventAdmin",
    "KindPauseAdmin",
    "WebhookDeliveryAdmin",
    "WebhookEndpointAdmin",
    "WorkerProcessAdmin",
]
