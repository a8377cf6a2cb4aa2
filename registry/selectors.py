"""Reads for the API and the UI (of users and tokens: ``registry/access/selectors.py``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone

from registry import serving
from registry.models import (
    PRODUCTION,
    Alias,
    AliasMove,
    BatchCheck,
    DeriveJob,
    ModelFile,
    ModelVersion,
    PromotionRequest,
    RegisteredModel,
    VersionBenchmark,
    VersionStatus,
)


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


# Which versions a list shows by their lifecycle: active ones by default; archived, tombstones, or all on request.
LIFECYCLES = ("active", "archived", "deleted", "all")


def version_list(*, model: RegisteredModel, status: str = "", lifecycle: str = "all") -> QuerySet[ModelVersion]:
    """A model's versions, newest first: only those with ``status``, and ``lifecycle`` (one of :data:`LIFECYCLES`)."""
    versions = (
        ModelVersion.objects.filter(model=model)
        .select_related("model", "created_by", "archived_by", "held_by", "deleted_by")
        .prefetch_related(Prefetch("files", queryset=ModelFile.objects.order_by("id")))
    )
    if status:
        versions = versions.filter(status=status)
    if lifecycle == "active":
        versions = versions.filter(archived_at__isnull=True, deleted_at__isnull=True)
    elif lifecycle == "archived":
        versions = versions.filter(archived_at__isnull=False, deleted_at__isnull=True)
    elif lifecycle == "deleted":
        versions = versions.filter(deleted_at__isnull=False)
    elif lifecycle != "all":
        raise ValueError(f"lifecycle must be one of {LIFECYCLES}, not {lifecycle!r}")
    return versions.order_by("-version")


def version_stuck_ids(*, pending_older_than: timedelta) -> list[int]:
    """Ids of versions whose validation was lost: pending too long, or validating with no heartbeat."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.VALIDATION_STALE_SECONDS)
    return list(
        ModelVersion.objects.filter(
            Q(status=VersionStatus.PENDING, created_at__lt=now - pending_older_than)
            | Q(status=VersionStatus.VALIDATING, validation_heartbeat_at__lt=stale)
        ).values_list("pk", flat=True)
    )


def version_batch_unchecked_ids(*, limit: int) -> list[int]:
    """Ready versions validated before validation checked whether their requests may be merged, oldest first."""
    unchecked = ModelVersion.objects.filter(status=VersionStatus.READY, batch_check=BatchCheck.UNCHECKED, batch_note="")
    return list(unchecked.order_by("pk").values_list("pk", flat=True)[:limit])


def alias_list(*, model: RegisteredModel) -> QuerySet[Alias]:
    return Alias.objects.filter(model=model).select_related("version").order_by("name")


def alias_history(*, alias: Alias) -> QuerySet[AliasMove]:
    return alias.moves.select_related("from_version", "to_version", "moved_by").order_by("moved_at", "id")


def alias_move_at(*, alias: Alias, at: datetime) -> AliasMove | None:
    """The move that set what the alias pointed to at ``at`` (None if it pointed nowhere yet)."""
    return alias_history(alias=alias).filter(moved_at__lte=at).order_by("-moved_at", "-id").first()


def promotion_list(*, state: str = "", model_name: str = "", kind: str = "") -> QuerySet[PromotionRequest]:
    requests = PromotionRequest.objects.select_related(
        "alias__model", "version", "base_version", "requested_by", "decided_by"
    )
    if state:
        requests = requests.filter(state=state)
    if kind:
        requests = requests.filter(kind=kind)
    if model_name:
        requests = requests.filter(alias__model__name=model_name)
    return requests.order_by("-requested_at", "-id")


def model_alias_history(*, model: RegisteredModel) -> QuerySet[AliasMove]:
    """Every move of every alias of a model, newest first."""
    return (
        AliasMove.objects.filter(alias__model=model)
        .select_related("alias", "from_version", "to_version", "moved_by")
        .order_by("-moved_at", "-id")
    )


def model_list_with_versions(*, query: str = "", tag: str = "") -> QuerySet[RegisteredModel]:
    """Models annotated with their latest version number and the version behind ``production``."""
    production = Alias.objects.filter(model=OuterRef("pk"), name=PRODUCTION).values("version__version")[:1]
    return model_list(query=query, tag=tag).annotate(
        latest_version=Max("versions__version"), production_version=Subquery(production)
    )


def version_get(*, model: RegisteredModel, number: int) -> ModelVersion | None:
    """One version with its files and uploader, or None."""
    return version_list(model=model).filter(version=number).first()


def aliases_at(*, model: RegisteredModel, at: datetime) -> list[tuple[Alias, AliasMove | None]]:
    """Each alias of the model with the move that set what it pointed to at ``at`` (None: nothing yet)."""
    return [(alias, alias_move_at(alias=alias, at=at)) for alias in alias_list(model=model)]


def version_fleet_state(*, model: str, version: int) -> list[tuple[serving.FleetWorker, serving.LoadedRow | None]]:
    """Every inference process, with its row for this version if it has one (loaded, loading, failed)."""
    rows = []
    for worker in serving.fleet_list():
        row = next((r for r in worker.loaded if r.model == model and r.version == version), None)
        rows.append((worker, row))
    return rows


def derive_job_list(*, source: ModelVersion | None = None) -> QuerySet[DeriveJob]:
    jobs = DeriveJob.objects.select_related("source__model", "result", "requested_by")
    return jobs.filter(source=source) if source is not None else jobs


def benchmark_list(*, version: ModelVersion) -> QuerySet[VersionBenchmark]:
    return VersionBenchmark.objects.filter(version=version).select_related("version").order_by("provider")
