"""URLs of the jobstate REST API; the demo project mounts them under /api/.

``schema/`` and ``docs/`` serve the OpenAPI schema and Swagger UI of these
endpoints alone, whatever the project's REST_FRAMEWORK settings (a project that
mounts drf-spectacular's own views earlier at the same paths serves those).

``urlpatterns`` ends with a JSON 404 for any other path under the mount point;
``include(api_patterns)`` instead leaves unmatched paths to the project.
"""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from jobstate.api.assets import AssetViewSet
from jobstate.api.base import ApiRoot
from jobstate.api.errors import not_found
from jobstate.api.kinds import KindList
from jobstate.api.pauses import PauseKind, ResumeKind
from jobstate.api.schema import JobstateDocsView, JobstateSchemaView
from jobstate.api.views import JobViewSet
from jobstate.api.webhooks import WebhookEndpointViewSet

app_name = "jobstate-api"

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("assets", AssetViewSet, basename="asset")
router.register("webhooks", WebhookEndpointViewSet, basename="webhook")

patterns = [
    path("", ApiRoot.as_view(), name="root"),
    path("kinds/", KindList.as_view(), name="kind-list"),
    # <path:>: a kind's name may hold any character but control ones (a slash too).
    path("kinds/<path:name>/pause/", PauseKind.as_view(), name="kind-pause"),
    path("kinds/<path:name>/resume/", ResumeKind.as_view(), name="kind-resume"),
    path("schema/", JobstateSchemaView.as_view(), name="schema"),
    path("docs/", JobstateDocsView.as_view(), name="docs"),
    *router.urls,
]
# With the app name: the API reverses its own URLs in it (the Location of a new job,
# the links of the API root, the schema URL of Swagger UI), so a bare list of
# patterns, included, answered 500s.
api_patterns = (patterns, app_name)
urlpatterns = [*patterns, re_path(r"^[\s\S]*$", not_found, name="not-found")]
