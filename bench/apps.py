from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "jobstate_bench"
    default_auto_field = "django.db.models.BigAutoField"
