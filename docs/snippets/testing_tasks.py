# invoices/tasks.py: a django.tasks task on jobstate's backend.
try:
    from django.tasks import task  # Django 6.0+
except ImportError:
    from django_tasks import task  # Django 5.2 + the django-tasks backport


@task()
def send_receipt(number: int) -> str:
    return f"receipt {number} sent"
