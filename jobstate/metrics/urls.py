"""``path("", include("jobstate.metrics.urls"))`` serves ``/metrics/``."""

from django.urls import path

from jobstate.metrics.views import metrics

app_name = "jobstate-metrics"

urlpatterns = [path("metrics/", metrics, name="metrics")]
