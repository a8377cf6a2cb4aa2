"""What a client learns from moving an alias: the move a PUT made, and ``approve?wait=`` waiting for the fleet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.models import Alias, InferenceWorker, PromotionRequest, PromotionState
from tests.support.registry import create_model, set_alias, upload_versions

pytestmark = pytest.mark.django_db


def test_a_direct_move_answers_with_the_move_it_made(owner):
    create_model(owner)
    upload_versions(owner, [1.0, 2.0])
    assert set_alias(owner, "staging", 1).status_code == 200

    response = set_alias(owner, "staging", 2)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["alias"], body["version"]) == ("staging", 2)
    move = body["move"]
    assert (move["from_version"], move["to_version"], move["kind"], move["reason"], move["moved_by"]) == (
        1,
        2,
        "set",
        "test",
        "owner",
    )
    # Already there: nothing moved, and the answer says so.
    assert set_alias(owner, "staging", 2).json()["move"] is None


def _offline_worker_serving(version: int) -> None:
    """A process heard from a minute ago (offline, not yet forgotten) that last served ``version`` on production."""
    seen = timezone.now() - timedelta(seconds=60)
    InferenceWorker.objects.create(
        worker_id="cut-off",
        host="cut-off",
        pid=1,
        device="cpu",
        provider="CPUExecutionProvider",
        loaded=[{"model": "demo", "version": version, "aliases": ["production"], "state": "ready", "error": ""}],
        started_at=seen,
        heartbeat_at=seen,
    )


def test_approve_with_wait_answers_504_naming_the_laggards_once_approved(owner, approver):
    create_model(owner)
    upload_versions(owner, [1.0])
    promotion = set_alias(owner, "production", 1).json()
    _offline_worker_serving(0)

    response = approver.post(f"/api/v1/promotions/{promotion['id']}/approve?wait=1", {"reason": "ok"})
    assert response.status_code == 504, response.content
    body = response.json()
    assert body["error"] == (
        "1 inference worker(s) did not serve version 1 within 1 s; the promotion is approved and the alias has moved"
    )
    assert [laggard["worker_id"] for laggard in body["detail"]["laggards"]] == ["cut-off"]
    assert (body["detail"]["promotion"]["state"], body["detail"]["promotion"]["version"]) == ("approved", 1)
    assert Alias.objects.get(model__name="demo", name="production").version.version == 1


def test_approve_with_wait_answers_200_when_the_fleet_serves_it(owner, approver):
    create_model(owner)
    upload_versions(owner, [1.0])
    promotion = set_alias(owner, "production", 1).json()

    response = approver.post(f"/api/v1/promotions/{promotion['id']}/approve?wait=5", {"reason": "ok"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "approved"


def test_approve_with_a_bad_wait_is_400_and_decides_nothing(owner, approver):
    create_model(owner)
    upload_versions(owner, [1.0])
    promotion = set_alias(owner, "production", 1).json()

    response = approver.post(f"/api/v1/promotions/{promotion['id']}/approve?wait=soon", {"reason": "ok"})
    assert response.status_code == 400
    assert response.json()["error"] == "'wait' must be a number of seconds between 0 and 600, got 'soon'"
    assert PromotionRequest.objects.get(pk=promotion["id"]).state == PromotionState.PENDING
