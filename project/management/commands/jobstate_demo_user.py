"""Create (or reset) the demo superuser and print its credentials and API token.

Demo only: these credentials exist in the demo project, never in jobstate.
"""

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

USERNAME = "demo"
PASSWORD = "demo-password"


# make demo's web server (scripts/demo.py: DEMO_PORT, default 8000).
BASE = f"http://127.0.0.1:{os.environ.get('DEMO_PORT') or 8000}"


class Command(BaseCommand):
    help = "Create the demo superuser and print its credentials and API token."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(PASSWORD)
        user.save()
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(
            f"Demo superuser: {USERNAME} / {PASSWORD}\nAPI token: {token.key}\n"
            f"Admin: {BASE}/admin/   API: {BASE}/api/"
        )
