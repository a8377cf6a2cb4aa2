"""Without a broker, `modelyard serve` runs the beat schedule in a thread of its own."""

from __future__ import annotations

import io
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from modelyard.embedded import EmbeddedScheduler
from registry import queueing, services
from registry.audit.chain import SYSTEM
from registry.models import ModelVersion, RegisteredModel, VersionStatus
from registry.uploads import LocalUpload, version_upload
from storage import get_storage
from tests.support.onnx_models import add_model_bytes, endless_loop_model


def _stored_version(name: str, data: bytes) -> ModelVersion:
    """A version whose validation task was lost (e.g. the process died before it ran): pending for 10 minutes."""
    model = services.model_create(name=name, actor=SYSTEM)
    version = version_upload(model=model, source=LocalUpload([("model.onnx", data)]), actor=SYSTEM)
    ModelVersion.objects.filter(pk=version.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    return version


def _validation_children() -> list[int]:
    """Process ids of this process's validation children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"onnxkit.validation:validate_child" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.django_db(transaction=True)
def test_embedded_scheduler_sweeps_a_lost_validation(settings, monkeypatch):
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)
    version = _stored_version("m", add_model_bytes())
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


@pytest.mark.django_db(transaction=True)
def test_periodic_jobs_keep_their_schedule_while_a_swept_validation_runs(settings, monkeypatch):
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)
    version = _stored_version("loop", endless_loop_model().SerializeToString())
    monkeypatch.undo()
    settings.VALIDATION_TIMEOUT_SECONDS = 120  # longer than this test: the validation is still running at the end
    settings.GC_GRACE_SECONDS = 0
    orphan = get_storage().write("artifacts/gone/y/model.onnx", io.BytesIO(b"no version has this"))
    # The sweep comes first, so the old scheduler would be stuck in the validation before collecting.
    settings.CELERY_BEAT_SCHEDULE = {
        "sweep": {"task": "registry.tasks.sweep_stuck_versions", "schedule": 0.5},
        "collect": {"task": "registry.tasks.collect_orphaned_artifacts", "schedule": 0.5},
    }

    scheduler = EmbeddedScheduler()
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            collected = not get_storage().exists(orphan.key)
            validating = ModelVersion.objects.get(pk=version.pk).status == VersionStatus.VALIDATING
            if collected and validating and _validation_children():
                break
            time.sleep(0.1)
        # The orphan was collected while the swept validation was running, on another thread.
        assert collected, "orphan collection did not run while the validation was running"
        assert ModelVersion.objects.get(pk=version.pk).status == VersionStatus.VALIDATING
        assert _validation_children()
    finally:
        scheduler.stop()
        scheduler.join(timeout=10)
        for pid in _validation_children():  # end the endless validation rather than wait out its limit
            os.killpg(pid, signal.SIGKILL)
    assert not scheduler.is_alive(), "the scheduler thread is stuck"
    deadline = time.monotonic() + 30
    while ModelVersion.objects.get(pk=version.pk).status != VersionStatus.FAILED and time.monotonic() < deadline:
        time.sleep(0.1)
    version.refresh_from_db()
    assert version.status == VersionStatus.FAILED
    assert version.errors[0].startswith("validation stopped while ")
    assert "its process was killed (SIGKILL)" in version.errors[0]


@pytest.mark.parametrize(
    ("broker", "role", "runs"),
    [
        (None, "all", True),
        (None, "web", True),
        (None, "inference", False),  # the registry's jobs stay with the registry's process
        ("redis://127.0.0.1:6379/0", "all", False),  # Celery beat runs them
        ("redis://127.0.0.1:6379/0", "web", False),
    ],
)
def test_the_embedded_beat_runs_without_a_broker_in_a_process_that_serves_the_registry(settings, broker, role, runs):
    from modelyard import embedded

    settings.BROKER_URL = broker
    assert embedded.runs_in(role) is runs
