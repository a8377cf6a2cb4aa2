"""Reads for the API and the UI."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from registry.models import ModelFile, ModelVersion, RegisteredModel


def model_list(*, query: str = "", tag: str = "") -> QuerySet[RegisteredModel]:
    models = RegisteredModel.objects.select_related("created_by")
    if query:
        models = models.filter(name__icontains=query) | models.filter(description__icontains=query)
    if tag:
        models = models.filter(tags__contains=[tag]) if _json_contains_supported() else _filter_tag(models, tag)
    return models.order_by("name")


def _json_contains_supported() -> bool:
    from django.db import connection

    return connection.features.supports_json_field_contains


def _filter_tag(models: QuerySet[RegisteredModel], tag: str) -> QuerySet[RegisteredModel]:
    ids = [m.pk for m in models if tag in (m.tags or [])]
    return RegisteredModel.objects.filter(pk__in=ids)


def version_list(*, model: RegisteredModel, status: str = "") -> QuerySet[ModelVersion]:
    versions = (
        ModelVersion.objects.filter(model=model)
        .select_related("model", "created_by")
        .prefetch_related(Prefetch("files", queryset=ModelFile.objects.order_by("id")))
    )
    if status:
        versions = versions.filter(status=status)
    return versions.order_by("-version")
