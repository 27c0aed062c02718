from django.apps import AppConfig


class TasksAppConfig(AppConfig):
    """A small project app written against Django's tasks API for django-tasks-db."""

    name = "tests.tasks_app"
    label = "tasks_app"
