"""The Celery app. Without MODELYARD_BROKER_URL, tasks run in-process (eagerly, after commit)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")

app = Celery("modelyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
