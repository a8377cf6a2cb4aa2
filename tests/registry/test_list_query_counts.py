"""Every list endpoint costs a fixed number of queries: N rows and 3N rows cost the same, and no more than the pin.

A serializer that reads a relation per row (an N+1) fails here before it shows up as a slow page.
Rows are made through the real services, except fleet reports, which only inference processes write.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from registry import promotions, queueing, services
from registry.access import services as access
from registry.audit.chain import SYSTEM
from registry.models import (
    PRODUCTION,
    ApiToken,
    InferenceJob,
    InferenceWorker,
    ModelVersion,
    RegisteredModel,
    Role,
    VersionStatus,
    Webhook,
    WebhookDelivery,
)
from registry.webhooks import services as webhooks
from tests.support.audit_factory import append_bulk_events
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.uploads import upload_local

pytestmark = pytest.mark.django_db

N = 3


@pytest.fixture
def admin(db: None) -> Person:
    return make_person("admin", Role.ADMIN)


@pytest.fixture(autouse=True)
def _no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions stay pending unless a test says otherwise: what is listed matters here, not validation."""
    monkeypatch.setattr(queueing, "validation_enqueue", lambda version_id: None)


def _ready_versions(admin: Person, model: str, count: int) -> list[int]:
    numbers = []
    start = ModelVersion.objects.filter(model__name=model).count()  # new bytes each call: a duplicate is refused
    for index in range(start, start + count):
        files = [("model.onnx", add_model_bytes(bias=float(index))), ("tokenizer.json", b"{}")]
        numbers.append(upload_local(model, files, actor=admin.actor).version)
    ModelVersion.objects.filter(model__name=model).update(status=VersionStatus.READY)
    return numbers


def _models(admin: Person, count: int) -> None:
    start = RegisteredModel.objects.count()
    for index in range(start, start + count):
        services.model_create(name=f"m{index}", tags=["t"], actor=admin.actor)


def _versions(admin: Person, count: int) -> None:
    if not RegisteredModel.objects.filter(name="demo").exists():
        services.model_create(name="demo", actor=admin.actor)
    _ready_versions(admin, "demo", count)


def _aliases(admin: Person, count: int) -> None:
    if not RegisteredModel.objects.filter(name="demo").exists():
        services.model_create(name="demo", actor=admin.actor)
        _ready_versions(admin, "demo", 1)
    model = RegisteredModel.objects.get(name="demo")
    start = model.aliases.count()
    for index in range(start, start + count):
        promotions.alias_set(model=model, alias_name=f"a{index}", version_number=1, actor=admin.actor)


def _promotions(admin: Person, count: int) -> None:
    if not RegisteredModel.objects.filter(name="demo").exists():
        services.model_create(name="demo", actor=admin.actor)
    model = RegisteredModel.objects.get(name="demo")
    for number in _ready_versions(admin, "demo", count):
        outcome = promotions.alias_set(model=model, alias_name=PRODUCTION, version_number=number, actor=admin.actor)
        assert outcome.promotion is not None


def _audit_events(admin: Person, count: int) -> None:
    append_bulk_events(count)


def _tokens(admin: Person, count: int) -> None:
    start = ApiToken.objects.count()
    for index in range(start, start + count):
        access.token_create(username=f"user{index}", create_user=True, actor=SYSTEM)


def _fleet(admin: Person, count: int) -> None:
    now = timezone.now()
    start = InferenceWorker.objects.count()
    InferenceWorker.objects.bulk_create(
        InferenceWorker(
            worker_id=f"w{index}",
            host="host",
            pid=1000 + index,
            device="cpu",
            provider="CPUExecutionProvider",
            loaded=[{"model": "demo", "version": 1, "aliases": [PRODUCTION], "state": "ready"}],
            started_at=now - timedelta(minutes=1),
            heartbeat_at=now,
        )
        for index in range(start, start + count)
    )


def _webhooks(admin: Person, count: int) -> None:
    for index in range(count):
        webhooks.webhook_create(url=f"https://hooks.example.com/{index}", events=["alias.moved"], actor=admin.actor)


def _deliveries(admin: Person, count: int) -> None:
    hook = (
        Webhook.objects.first()
        or webhooks.webhook_create(url="https://hooks.example.com/", events=["version.ready"], actor=admin.actor)[0]
    )
    WebhookDelivery.objects.bulk_create(
        WebhookDelivery(webhook=hook, uuid=uuid.uuid4(), event="version.ready", model_name="m", version=1, body="{}")
        for _ in range(count)
    )


def _inference_jobs(admin: Person, count: int) -> None:
    if not RegisteredModel.objects.filter(name="demo").exists():
        services.model_create(name="demo", actor=admin.actor)
        _ready_versions(admin, "demo", 1)
    version = ModelVersion.objects.get(model__name="demo", version=1)
    user = admin.actor.user
    InferenceJob.objects.bulk_create(
        InferenceJob(
            public_id=uuid.uuid4().hex[:16], model=version.model, version=version, format="npz", created_by=user
        )
        for _ in range(count)
    )


def _results(body: Any) -> list[Any]:
    return body if isinstance(body, list) else body["results"]


# name: (path, how to add rows, the queries pinned: authentication, a count for a paged list, the rows)
LISTS: dict[str, tuple[str, Callable[[Person, int], None], int]] = {
    "models": ("/api/v1/models?page_size=500", _models, 3),
    "versions": ("/api/v1/models/demo/versions?page_size=500", _versions, 5),
    "aliases": ("/api/v1/models/demo/aliases", _aliases, 3),
    "promotions": ("/api/v1/promotions?page_size=500", _promotions, 3),
    "audit": ("/api/v1/audit?page_size=500", _audit_events, 3),
    "tokens": ("/api/v1/tokens?page_size=500", _tokens, 4),
    "fleet": ("/api/v1/fleet", _fleet, 2),
    "webhooks": ("/api/v1/webhooks?page_size=500", _webhooks, 4),  # + the admin role
    "deliveries": ("/api/v1/webhooks/{webhook}/deliveries?page_size=500", _deliveries, 5),  # + the webhook
    "inference-jobs": ("/api/v1/inference-jobs?page_size=500", _inference_jobs, 4),  # + the roles (whose jobs)
}


@pytest.mark.parametrize("name", list(LISTS))
def test_a_list_costs_the_same_queries_for_n_and_3n_rows(name, admin, django_assert_max_num_queries):
    path, add_rows, pinned = LISTS[name]
    add_rows(admin, N)
    if "{webhook}" in path:
        path = path.format(webhook=Webhook.objects.get().pk)
    admin.get(path)  # once, so per-process caches (content types, the role lookup) do not count

    with django_assert_max_num_queries(pinned) as few:
        response = admin.get(path)
    assert response.status_code == 200, response.content
    shown = len(_results(response.json()))
    assert shown >= N

    add_rows(admin, 2 * N)
    with django_assert_max_num_queries(len(few)) as many:
        response = admin.get(path)
    assert response.status_code == 200
    assert len(_results(response.json())) >= shown + 2 * N
    assert len(many) == len(few)
