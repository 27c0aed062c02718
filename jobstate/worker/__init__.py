"""Running jobs: the handler context, the runner, and the django-q2 glue."""
