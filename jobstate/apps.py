from django.apps import AppConfig


class JobstateConfig(AppConfig):
    name = "jobstate"
    # Not "Jobs": that is the Job model's plural, and breadcrumbs read "Jobs > Jobs".
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        # settings_checks: its import registers the JOBSTATE and storage checks.
        from jobstate import metrics, registry, settings_checks, tasks, tracing, webhooks, workflows  # noqa: F401
        from jobstate.api import checks as api_checks  # noqa: F401  (registers the API's apps check)
        from jobstate.models import Asset
        from jobstate.services.assets import delete_stored_file
        from jobstate.worker import checks  # noqa: F401  (registers the Q_CLUSTER checks)

        # Assets also die in cascades Django runs (deleting a job, its parent
        # or a pruned batch); post_delete is the one hook that sees them all.
        post_delete.connect(
            lambda sender, instance, **kw: delete_stored_file(instance),
            sender=Asset,
            weak=False,
            dispatch_uid="jobstate_asset_file_cleanup",
        )
        registry.autodiscover()
        workflows.install()
        # Higher layers register on the core's hooks (jobstate.hooks).
        from jobstate.api.outputs import JobDetailSerializer

        webhooks.install(serializer=JobDetailSerializer)
        metrics.install()
        tracing.install()
        tasks.install()  # django.tasks backend: registers the kinds of @task functions
