python manage.py migrate
python manage.py check                # jobstate's checks warn about a dangerous Q_CLUSTER or SQLite setup
python manage.py jobstate_schedule    # the reaper every minute, retention daily (idempotent)
DJANGO_SUPERUSER_PASSWORD=change-me python manage.py createsuperuser --noinput --username admin --email admin@example.com
python manage.py drf_create_token admin   # prints the API token
