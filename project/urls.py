from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

# Media files are never served statically: assets are downloaded through the
# API, which checks the owner.
urlpatterns = [
    path("admin/", admin.site.urls),
    # The OpenAPI schema and Swagger UI (served from drf-spectacular-sidecar, no CDN);
    # before the API include, whose last pattern answers JSON 404s under /api/.
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("jobstate.api.urls")),
    path("", include("jobstate.metrics.urls")),  # /metrics/ (Prometheus)
]
