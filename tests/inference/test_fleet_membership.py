"""Who counts for ``?wait=``: online workers, and offline ones not yet forgotten; a clean stop leaves the fleet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.models import InferenceWorker
from tests.support.polling import eventually
from tests.support.registry import create_model, set_alias, set_served, upload_versions


def worker(worker_id: str, *, silent_for: float, serving: int) -> InferenceWorker:
    """A fleet row as a process last reported it: serving ``serving`` under staging, heard from ``silent_for`` s ago."""
    now = timezone.now()
    row = {"model": "demo", "version": serving, "aliases": ["staging"], "state": "ready", "error": ""}
    return InferenceWorker.objects.create(
        worker_id=worker_id,
        host=worker_id,
        pid=1,
        device="cpu",
        provider="CPUExecutionProvider",
        loaded=[row],
        started_at=now - timedelta(hours=3),
        heartbeat_at=now - timedelta(seconds=silent_for),
    )


@pytest.mark.django_db
def test_wait_names_an_offline_worker_as_lagging_until_it_is_forgotten(owner, admin, settings):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    assert set_alias(owner, "staging", 1).status_code == 200
    set_served(admin, "staging", True)
    worker("up", silent_for=1, serving=2)  # already reports version 2
    worker("cut-off", silent_for=60, serving=1)  # offline (3 beats, at least 15 s), within the hour
    worker("gone", silent_for=2 * 3600, serving=1)  # silent for longer than MODELYARD_FLEET_FORGET_SECONDS

    response = set_alias(owner, "staging", 2, wait=30)
    assert response.status_code == 504, response.content
    body = response.json()
    assert body["error"] == "1 inference worker(s) did not serve version 2 within 30 s; the alias has moved"
    [laggard] = body["detail"]["laggards"]
    assert (laggard["worker_id"], laggard["serving"], laggard["state"]) == ("cut-off", 1, "offline")
    assert (
        laggard["error"]
        == f"no heartbeat since {InferenceWorker.objects.get(worker_id='cut-off').heartbeat_at.isoformat()}"
    )

    settings.FLEET_FORGET_SECONDS = 30
    response = set_alias(owner, "staging", 2, wait=30)
    assert response.status_code == 200, response.content


@pytest.mark.django_db(transaction=True)
def test_a_cleanly_stopped_runtime_leaves_the_fleet(make_runtime):
    runtime = make_runtime("leaving")
    runtime.start()
    eventually(lambda: InferenceWorker.objects.filter(worker_id="leaving").exists(), what="no heartbeat")
    runtime.stop()
    assert not InferenceWorker.objects.filter(worker_id="leaving").exists()
