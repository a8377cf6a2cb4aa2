"""The registry's metrics: the database at scrape time, uploads as they happen, the broker's queue, who may scrape.

In-process, on the test database; version rows are put in the states validation leaves them in.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone
from kombu import Connection

from modelyard import metrics as exposition
from registry import metrics, serving
from registry.models import ModelVersion, PromotionRequest, Role, VersionStatus
from registry.tasks import verify_audit_chain
from tests.support.onnx_models import add_model_bytes
from tests.support.people import make_person
from tests.support.prometheus import samples, value
from tests.support.registry import create_model, set_alias
from tests.support.s3 import closed_port_url

pytestmark = pytest.mark.django_db

REDIS_URL = f"redis://127.0.0.1:6379/{os.environ.get('MODELYARD_TEST_REDIS_DB', '0')}"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture(autouse=True)
def database_collector() -> Iterator[None]:
    """What modelyard.asgi does for the web role: read the registry's state at every scrape."""
    exposition.add_collector(metrics.DATABASE)
    yield
    exposition.remove_collector(metrics.DATABASE)


def registry_exposition() -> str:
    body, _ = exposition.render()
    return body.decode()


def registry_samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(name, tuple(sorted(labels.items()))): v for name, labels, v in samples(registry_exposition())}


def test_versions_backlog_and_validations_come_from_the_version_rows(owner, settings):
    create_model(owner)
    for bias in (1.0, 2.0, 3.0, 4.0):
        assert owner.upload("demo", [("model.onnx", add_model_bytes(bias=bias))]).status_code == 201
    now = timezone.now()
    one, two, three, _four = ModelVersion.objects.order_by("version")
    # As validation leaves them: a claim, then a verdict (0.3 s, 45 s); one in validation; one waiting.
    ModelVersion.objects.filter(pk=one.pk).update(
        status=VersionStatus.READY, validation_started_at=now - timedelta(seconds=0.3), validated_at=now
    )
    ModelVersion.objects.filter(pk=two.pk).update(
        status=VersionStatus.FAILED, validation_started_at=now - timedelta(seconds=45), validated_at=now
    )
    ModelVersion.objects.filter(pk=three.pk).update(status=VersionStatus.VALIDATING, validation_started_at=now)
    ModelVersion.objects.filter(pk=_four.pk).update(
        status=VersionStatus.PENDING, created_at=now - timedelta(seconds=600)
    )

    got = registry_samples()
    assert [
        got[("modelyard_model_versions", (("status", s),))] for s in ("pending", "validating", "ready", "failed")
    ] == [
        1,
        1,
        1,
        1,
    ]
    assert got[("modelyard_validation_backlog", ())] == 2
    assert 600 <= got[("modelyard_validation_backlog_oldest_seconds", ())] < 700
    buckets = [(dict(lab), v) for (n, lab), v in got.items() if n == "modelyard_validation_seconds_bucket"]
    ready = {lab["le"]: v for lab, v in buckets if lab["outcome"] == "ready"}
    failed = {lab["le"]: v for lab, v in buckets if lab["outcome"] == "failed"}
    assert (ready["0.5"], ready["+Inf"]) == (1, 1)
    assert (failed["30.0"], failed["60.0"], failed["+Inf"]) == (0, 1, 1)
    assert got[("modelyard_validation_seconds_count", (("outcome", "failed"),))] == 1
    assert got[("modelyard_validation_seconds_sum", (("outcome", "failed"),))] == pytest.approx(45)


def test_promotion_requests_are_counted_by_state(owner, approver):
    create_model(owner)
    for bias in (1.0, 2.0):
        owner.upload("demo", [("model.onnx", add_model_bytes(bias=bias))])
    ModelVersion.objects.update(status=VersionStatus.READY)
    first = set_alias(owner, "production", 1).json()["id"]
    assert approver.post(f"/api/v1/promotions/{first}/approve", {"reason": "ok"}).status_code == 200
    assert set_alias(owner, "production", 2).status_code == 202
    got = registry_samples()
    states = {s: got[("modelyard_promotion_requests", (("state", s),))] for s in ("pending", "approved", "rejected")}
    assert states == {"pending": 1, "approved": 1, "rejected": 0}
    assert PromotionRequest.objects.count() == 2


def test_audit_events_and_the_periodic_chain_check(owner):
    create_model(owner)
    from registry.models import AuditChainHead

    exposition_before = registry_exposition()
    assert value(exposition_before, "modelyard_audit_events_total") == AuditChainHead.objects.get().last_seq
    assert "modelyard_audit_chain_ok" not in exposition_before  # absent until the check has run once
    assert verify_audit_chain.apply().get() is True
    got = registry_exposition()
    assert value(got, "modelyard_audit_chain_ok") == 1
    assert value(got, "modelyard_audit_chain_verified_seq") == AuditChainHead.objects.get().last_seq
    assert value(got, "modelyard_audit_chain_checked_timestamp_seconds") == pytest.approx(
        timezone.now().timestamp(), abs=60
    )


def test_fleet_members_are_up_while_online_and_down_once_silent(settings):
    settings.FLEET_HEARTBEAT_SECONDS = 5.0
    from registry.models import InferenceWorker

    for worker_id in ("inf-a", "inf-b", "inf-gone"):
        serving.worker_heartbeat(
            serving.WorkerReport(
                worker_id=worker_id, host="h", pid=1, device="cpu", provider="CPU", started_at=timezone.now(), loaded=()
            )
        )
    InferenceWorker.objects.filter(worker_id="inf-b").update(heartbeat_at=timezone.now() - timedelta(seconds=20))
    InferenceWorker.objects.filter(worker_id="inf-gone").update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.FLEET_FORGET_SECONDS + 1)
    )
    got = registry_samples()
    up = {dict(lab)["worker"]: v for (n, lab), v in got.items() if n == "modelyard_fleet_worker_up"}
    assert up == {"inf-a": 1, "inf-b": 0}  # forgotten ones are not named at all


def test_uploads_are_counted_and_timed_by_outcome(owner):
    create_model(owner)

    def count(outcome: str) -> float:
        return value(registry_exposition(), "modelyard_upload_seconds_count", outcome=outcome)

    accepted, refused = count("accepted"), count("refused")
    assert owner.upload("demo", [("model.onnx", add_model_bytes())]).status_code == 201
    assert owner.upload("demo", [("model.onnx", b"not onnx at all")]).status_code == 400
    assert owner.upload("demo", [("model.onnx", b"")]).status_code == 400
    assert (count("accepted"), count("refused")) == (accepted + 1, refused + 2)


def test_the_celery_queue_length_is_read_from_redis(settings):
    settings.BROKER_URL = REDIS_URL
    client = redis.Redis.from_url(REDIS_URL)
    client.delete("celery")
    try:
        assert value(registry_exposition(), "modelyard_celery_queue_length", queue="celery") == 0
        for i in range(3):
            client.lpush("celery", json.dumps({"task": i}))
        assert value(registry_exposition(), "modelyard_celery_queue_length", queue="celery") == 3
    finally:
        client.delete("celery")


def test_the_queue_length_is_read_from_rabbitmq_with_a_passive_declare():
    queue = f"modelyard-test-{uuid.uuid4().hex[:8]}"
    assert metrics.celery_queue_length(AMQP_URL, queue, 2.0) == 0  # never declared
    with Connection(AMQP_URL, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_declare(queue=queue, auto_delete=False)
        producer = conn.Producer(channel)
        for i in range(2):
            producer.publish({"i": i}, routing_key=queue, serializer="json")
        try:
            assert metrics.celery_queue_length(AMQP_URL, queue, 2.0) == 2
        finally:
            channel.queue_delete(queue)


def test_without_a_broker_or_with_one_down_the_queue_length_is_absent_and_the_scrape_answers(settings):
    settings.BROKER_URL = None
    assert "modelyard_celery_queue_length" not in registry_exposition()
    settings.BROKER_URL = closed_port_url().replace("http://", "redis://") + "/0"
    settings.READY_TIMEOUT_SECONDS = 0.5
    got = registry_exposition()
    assert "modelyard_celery_queue_length" not in got
    assert value(got, "modelyard_registry_metrics_up") == 1


# --- The web role's /metrics ------------------------------------------------------------------------------


def call(method: str = "GET", token: str | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    asyncio.run(metrics.app({"type": "http", "method": method, "path": "/metrics", "headers": headers}, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.django_db(transaction=True)
def test_the_web_roles_metrics_need_an_inference_or_admin_token_unless_public(settings):
    people = {role: make_person(f"scraper-{role}", role) for role in (Role.INFERENCE, Role.ADMIN, Role.VIEWER)}
    refusal = {"error": "a bearer token with the inference or admin role is required (MODELYARD_METRICS_PUBLIC)"}
    for token in (None, people[Role.VIEWER].token, "my_x_nonsense"):
        status, _, body = call(token=token)
        assert (status, json.loads(body)) == (401, refusal)
    for role in (Role.INFERENCE, Role.ADMIN):
        status, headers, body = call(token=people[role].token)
        assert status == 200
        assert headers[b"content-type"].startswith(b"text/plain")
        assert b"modelyard_model_versions{" in body and b"modelyard_registry_metrics_up 1.0" in body
    settings.METRICS_PUBLIC = True
    assert call()[0] == 200
    status, headers, _ = call("POST")
    assert (status, headers[b"allow"]) == (405, b"GET, HEAD")
