"""URLs of the jobstate REST API; the demo project mounts them under /api/.

``urlpatterns`` ends with a JSON 404 for any other path under the mount point;
include ``api_patterns`` instead to leave unmatched paths to the project.
"""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from jobstate.api.assets import AssetViewSet
from jobstate.api.base import ApiRoot
from jobstate.api.errors import not_found
from jobstate.api.views import JobViewSet

app_name = "jobstate-api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("assets", AssetViewSet, basename="asset")

api_patterns = [path("", ApiRoot.as_view(), name="root"), *router.urls]
urlpatterns = [*api_patterns, re_path(r"^[\s\S]*$", not_found, name="not-found")]
