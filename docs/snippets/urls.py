from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The jobstate API, with its own OpenAPI schema at /api/schema/ and Swagger UI at
    # /api/docs/ (whatever the project's REST_FRAMEWORK says); it ends with a JSON 404
    # for any other path under /api/.
    path("api/", include("jobstate.api.urls")),
]
