from django.contrib import admin
from django.urls import include, path

# Media files are never served statically: assets are downloaded through the
# API, which checks the owner.
urlpatterns = [
    path("admin/", admin.site.urls),
    # The jobstate API, with its own OpenAPI schema at /api/schema/ and Swagger UI at
    # /api/docs/ (from drf-spectacular-sidecar: no CDN), as any project gets them.
    path("api/", include("jobstate.api.urls")),
    path("", include("jobstate.metrics.urls")),  # /metrics/ (Prometheus)
]
