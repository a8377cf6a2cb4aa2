"""Without a broker, `modelyard serve` runs the beat schedule in a thread of its own."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from modelyard.embedded import EmbeddedScheduler
from registry import services
from registry.audit import SYSTEM
from registry.models import ModelVersion, RegisteredModel, VersionStatus
from storage import get_storage
from tests.onnx_models import add_model_bytes


@pytest.mark.django_db(transaction=True)
def test_embedded_scheduler_sweeps_a_lost_validation(settings, monkeypatch):
    # A version whose validation task was lost (e.g. the process died before it ran).
    monkeypatch.setattr(services, "_enqueue_validation", lambda version_id: None)
    model = services.model_create(name="m", actor=SYSTEM)
    written = get_storage().write("artifacts/m/x/model.onnx", io.BytesIO(add_model_bytes()))
    file = services.StoredFile(
        name="model.onnx", storage_key=written.key, sha256=written.sha256, size_bytes=written.size
    )
    version = services.version_create(model=model, files=[file], actor=SYSTEM)
    ModelVersion.objects.filter(pk=version.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    monkeypatch.undo()

    settings.CELERY_BEAT_SCHEDULE = {"sweep": {"task": "registry.tasks.sweep_stuck_versions", "schedule": 0.5}}
    scheduler = EmbeddedScheduler()
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = ModelVersion.objects.get(pk=version.pk).status
            if status == VersionStatus.READY:
                break
            time.sleep(0.2)
    finally:
        scheduler.stop()
        scheduler.join(timeout=10)
    assert ModelVersion.objects.get(pk=version.pk).status == VersionStatus.READY
    assert RegisteredModel.objects.count() == 1
