"""A project that mounts only the jobstate API, as a new project following the
docs would (its schema and docs come with it): used by the host-settings tests."""

from django.urls import include, path

urlpatterns = [path("api/", include("jobstate.api.urls"))]
