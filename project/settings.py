"""Settings for the jobstate demo and test project.

The embedded default is SQLite in ``var/``; set ``DATABASE_URL`` (for example
``postgres://postgres@127.0.0.1:5432/jobstate``) to run on PostgreSQL.
"""

import os
from pathlib import Path

import dj_database_url

import jobstate

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("JOBSTATE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# A demo-only key: real deployments set DJANGO_SECRET_KEY.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "jobstate",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

SQLITE_OPTIONS = {
    # WAL lets readers run beside the single writer; IMMEDIATE takes the write
    # lock at BEGIN so two writers queue on busy_timeout instead of failing
    # with "database is locked" on lock upgrade.
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}

DATABASES = {"default": dj_database_url.config(default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}", conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = SQLITE_OPTIONS
    # A file, not :memory:, so that worker processes started by the tests see it.
    DATABASES["default"]["TEST"] = {
        "NAME": str(VAR_DIR / f"test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.sqlite3")
    }
elif (
    DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    and os.environ.get("JOBSTATE_PG_PREPARE", "1") != "0"
):
    # Prepared statements, which Django leaves off for the sake of connection poolers:
    # jobstate then prepares the statements every job makes (docs/howto/postgresql.md).
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
MEDIA_URL = "media/"
MEDIA_ROOT = Path(os.environ.get("JOBSTATE_MEDIA_ROOT", VAR_DIR / "media"))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # One JSON error shape ({"error": {"code", "message", "fields"}}) for every DRF view.
    "EXCEPTION_HANDLER": "jobstate.api.errors.exception_handler",
    # jobstate's API throttles by scope; a scope without a rate (or None) is not limited.
    "DEFAULT_THROTTLE_RATES": {
        "jobstate_enqueue": os.environ.get("JOBSTATE_ENQUEUE_RATE", "600/minute"),
        "jobstate": os.environ.get("JOBSTATE_API_RATE") or None,
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "jobstate API",
    "DESCRIPTION": "Durable background jobs with a validated lifecycle.",
    "VERSION": jobstate.__version__,
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "jobstate.states.Status",
        "StepStatusEnum": "jobstate.models.step.SHOWN_STEP_STATUS",
    },
}

# django-q2 runs the jobs; the Job table is its broker (see docs/explanation/workers.md).
# Each job package carries its handler's own hard limit; "timeout"/"retry" bind
# only plain django-q2 tasks (the scheduled reaper and pruner, on the ORM queue).
# jobstate owns retries: django-q2 delivers once and keeps every failure.
Q_CLUSTER = {
    "name": "jobstate",
    "broker_class": "jobstate.worker.broker.JobBroker",
    "orm": "default",
    "workers": int(os.environ.get("JOBSTATE_WORKERS", "2")),
    "timeout": 600,
    "retry": 660,
    "max_attempts": 1,
    "ack_failures": True,
    "save_limit": 50,
    "save_limit_per": "group",
    "poll": float(os.environ.get("JOBSTATE_POLL", "0.5")),
    "catch_up": False,
}

JOBSTATE: dict[str, object] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "jobstate": {"handlers": ["console"], "level": os.environ.get("JOBSTATE_LOG", "INFO")},
    },
}
