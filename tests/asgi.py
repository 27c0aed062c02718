"""The test project as an ASGI application (``uvicorn tests.asgi:application``),
for the end-to-end stream tests (tests/test_api_stream_servers.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.test_settings")

application = get_asgi_application()
