"""Registry state for tests, made through the real API and services: models, uploads, aliases, promotions.

Every model here is ``y = x + bias`` (``tests.support.onnx_models.add_model``), so the bias an
inference response carries says which version answered.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings

from registry import promotions
from registry.models import (
    PRODUCTION,
    FileRole,
    ModelFile,
    ModelVersion,
    PromotionRequest,
    RegisteredModel,
    VersionStatus,
)
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person

MODEL = "demo"


def create_model(person: Person, name: str = MODEL) -> str:
    response = person.post("/api/v1/models", {"name": name})
    assert response.status_code == 201, response.content
    return name


def upload_versions(person: Person, biases: list[float], model: str = MODEL) -> list[ModelVersion]:
    """Upload ``y = x + bias`` once per bias; validation runs in-process, so each comes back ready."""
    versions = []
    for bias in biases:
        response = person.upload(model, [("model.onnx", add_model_bytes(bias=bias))])
        assert response.status_code == 201, response.content
        version = ModelVersion.objects.get(model__name=model, version=response.json()["version"])
        assert version.status == VersionStatus.READY, version.errors
        versions.append(version)
    return versions


def set_alias(person: Person, alias: str, version: int, *, model: str = MODEL, wait: float | None = None) -> Any:
    query = f"?wait={wait:g}" if wait is not None else ""
    return person.client.put(
        f"/api/v1/models/{model}/aliases/{alias}{query}",
        {"version": version, "reason": "test"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {person.token}",
    )


def promote(requester: Person, approver: Person, version: int, *, alias: str = PRODUCTION, model: str = MODEL) -> None:
    """Point a protected alias at ``version``: one person asks, another approves."""
    response = set_alias(requester, alias, version, model=model)
    assert response.status_code == 202, response.content
    approved = approver.post(f"/api/v1/promotions/{response.json()['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content


def set_served(admin: Person, alias: str, served: bool, *, model: str = MODEL) -> None:
    response = admin.patch(f"/api/v1/models/{model}/aliases/{alias}", {"served": served})
    assert response.status_code == 200, response.content


def artifact_path(version: ModelVersion) -> Path:
    """Where the local storage keeps the version's .onnx file."""
    key = ModelFile.objects.get(version=version, role=FileRole.MODEL).storage_key
    return Path(django_settings.STORAGE.path, *key.split("/"))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pending_promotion(requester: Person, *, model: str = MODEL) -> PromotionRequest:
    """Register ``model`` with two ready versions and ask, as ``requester``, to put version 1 on production."""
    create_model(requester, model)
    upload_versions(requester, [1.0, 2.0], model=model)
    outcome = promotions.alias_set(
        model=RegisteredModel.objects.get(name=model),
        alias_name=PRODUCTION,
        version_number=1,
        actor=requester.actor,
        reason="launch",
    )
    assert outcome.promotion is not None
    return outcome.promotion
