"""The jobstate admin: the job list, job page, operator actions, stuck jobs,
dashboard and assets. Importing this package registers the ModelAdmins."""

from jobstate.admin.assets import AssetAdmin
from jobstate.admin.events import JobEventAdmin
from jobstate.admin.jobs import JobAdmin
from jobstate.admin.workers import WorkerProcessAdmin
from jobstate.webhooks import admin as _webhooks_admin  # noqa: F401  (registers its ModelAdmins)

__all__ = ["AssetAdmin", "JobAdmin", "JobEventAdmin", "WorkerProcessAdmin"]
