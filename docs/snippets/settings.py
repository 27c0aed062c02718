# --- jobstate: added at the end of mysite/settings.py ---
INSTALLED_APPS += [
    "rest_framework",
    "rest_framework.authtoken",  # token authentication for the REST API
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from the package: no CDN
    "django_q",
    "jobstate",
    "reports",  # your app: its jobs.py is imported at startup
]

# Files that jobs produce (assets) go to this storage alias (a key of STORAGES;
# "default" is FileSystemStorage under MEDIA_ROOT). Without MEDIA_ROOT they would
# land in whatever directory each worker was started from.
MEDIA_ROOT = BASE_DIR / "media"
JOBSTATE = {
    "STORAGE": "default",
}

# SQLite: the web server and every worker process write to one file. WAL, IMMEDIATE
# transactions and a busy timeout keep them from failing with "database is locked"
# (jobstate.W009 warns without them). Not on PostgreSQL, which refuses them (E013).
DATABASES["default"]["OPTIONS"] = {
    "init_command": "PRAGMA journal_mode=WAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}

# --8<-- [start:qcluster]
# django-q2 runs the jobs; the Job table is its queue. Without this block qcluster
# looks for Redis (its default broker) and stops with "No module named 'redis'".
Q_CLUSTER = {
    "name": "mysite",
    "broker_class": "jobstate.worker.broker.JobBroker",  # the Job table is the queue
    "orm": "default",  # django-q2's own queue, for the scheduled reaper and pruner
    "workers": 2,  # worker processes per cluster
    "timeout": 600,  # plain django-q2 tasks only; each job carries its own hard limit
    "retry": 660,  # > timeout: a running task is never handed out twice
    "max_attempts": 1,  # jobstate owns retries
    "ack_failures": True,  # a failed package is not delivered again
    "save_limit": 50,  # keep the last 50 successes per schedule; failures always kept
    "save_limit_per": "group",
    "poll": 0.5,  # idle wait (PostgreSQL wakes earlier, on NOTIFY)
    "catch_up": False,  # after a downtime, one run of each schedule, not every missed one
}
# --8<-- [end:qcluster]
