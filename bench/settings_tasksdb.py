"""Django 6.1's tasks framework with django-tasks-db's database backend, for
bench/drain.py (run under the Django 6 venv: ``manage.py db_worker``)."""

import os

import dj_database_url

SECRET_KEY = "bench"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=None)}
# As project/settings.py (the other Django-based systems): prepared statements allowed.
# Django's ORM binds parameters client-side, so its own queries are not prepared.
DATABASES["default"]["OPTIONS"] = {"prepare_threshold": 5}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
