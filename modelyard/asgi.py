"""The ASGI entry point. The inference data plane (``/v2``, ``/metrics``) will be dispatched here
before Django's handler; for now every path goes to Django."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
application = get_asgi_application()
