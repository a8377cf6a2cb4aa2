"""Writes to models and versions. Each top-level service owns its transaction.

Users and tokens are written in ``registry/access/services.py``, a version's validation in
``registry/validation/services.py``, derive jobs in ``registry/derive/services.py``, aliases and
promotions in ``registry/promotions.py``; a version is created only through
``registry.uploads.version_upload``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from registry.audit.chain import Actor, audit_record, audit_version
from registry.errors import Conflict
from registry.lifecycle.lineage import duplicate_of, lineage_update, parent_for
from registry.models import DeriveJob, FileRole, JobStatus, ModelFile, ModelVersion, RegisteredModel, VersionStatus
from registry.promotions import alias_create_defaults
from registry.provenance.services import SignedBundle, signatures_record

logger = logging.getLogger(__name__)


# --- Models ------------------------------------------------------------------------------------


@transaction.atomic(durable=True)
def model_create(*, name: str, description: str = "", tags: Sequence[str] = (), actor: Actor) -> RegisteredModel:
    if RegisteredModel.objects.filter(name=name).exists():
        raise Conflict(f"a model named '{name}' already exists")
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=name, description=description, tags=list(tags), created_by=actor.user
            )
    except IntegrityError as exc:  # lost a race with a concurrent create of the same name
        raise Conflict(f"a model named '{name}' already exists") from exc
    alias_create_defaults(model=model)
    audit_record(
        actor=actor,
        action="model.create",
        target_type="model",
        target=name,
        model_name=name,
        after={"description": description, "tags": list(tags)},
    )
    return model


EDITABLE_MODEL_FIELDS = (
    "description",
    "tags",
    "serving_strategy",
    "batching",
    "max_batch_size",
    "max_queue_delay_us",
    "max_queue_size",
    "instances",
)


@transaction.atomic(durable=True)
def model_update(*, model: RegisteredModel, actor: Actor, **changes: Any) -> RegisteredModel:
    """Edit the description, tags and serving settings; unknown fields are a programming error."""
    unknown = set(changes) - set(EDITABLE_MODEL_FIELDS)
    if unknown:
        raise TypeError(f"model_update() got unexpected fields {sorted(unknown)}")
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    before = {name: getattr(model, name) for name in changes}
    for name, value in changes.items():
        setattr(model, name, list(value) if name == "tags" else value)
    model.save(update_fields=[*changes, "updated_at"])
    audit_record(
        actor=actor,
        action="model.update",
        target_type="model",
        target=model.name,
        model_name=model.name,
        before=before,
        after={name: getattr(model, name) for name in changes},
    )
    return model


# --- Versions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredFile:
    """A file already written to storage, about to be attached to a new version."""

    name: str
    storage_key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Derivation:
    """What makes an upload a derived version: its parent, how it was built, how far its outputs moved, its job."""

    parent: ModelVersion
    recipe: dict[str, Any]
    accuracy: dict[str, Any]
    job_id: int


@transaction.atomic(durable=True)
def version_create(
    *,
    model: RegisteredModel,
    files: Sequence[StoredFile],
    description: str = "",
    metadata: dict[str, Any] | None = None,
    actor: Actor,
    derivation: Derivation | None = None,
    signatures: Sequence[SignedBundle] = (),
    lineage: Mapping[str, Any] | None = None,
    allow_duplicate: bool = False,
) -> ModelVersion:
    """Record an uploaded bundle as a new ``pending`` version: the inner, transactional step of an upload.

    ``signatures``: the uploader's bundle, verified by the upload service, recorded with the files.
    ``lineage``: the source fields and the parent's number the upload named, checked by the upload service
    (``registry.lifecycle.lineage``); the parent is looked up here, under the model's lock.

    Files byte for byte those of a version of the model that is not deleted are refused (Conflict, naming
    it) unless ``allow_duplicate``, checked under the same lock, so two identical uploads at once make one
    version. A derived version is exempt: the registry built it on request, and it records what an upload
    of the same bytes would not (its parent, recipe, accuracy delta and signed derivation statement).

    Only the upload service (``registry.uploads.version_upload``) calls this: it has checked and
    stored the files (the first is the .onnx model), and it queues the validation once this commits.
    """
    if not files:
        raise ValueError("a version needs at least its .onnx file")
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    lineage = dict(lineage or {}) if derivation is None else {}
    parent = derivation.parent if derivation else None
    if lineage.get("parent") is not None:
        parent = parent_for(model, lineage["parent"])
    if derivation is None and not allow_duplicate:
        duplicate = duplicate_of(model, files)
        if duplicate is not None:
            raise Conflict(
                f"these bytes are already version {duplicate.version} of model '{model.name}' (the same files, "
                "byte for byte); send allow_duplicate=true to upload them again",
                {"version": duplicate.version},
            )
    model.last_version += 1
    model.save(update_fields=["last_version", "updated_at"])
    onnx_file = files[0]
    version = ModelVersion.objects.create(
        model=model,
        version=model.last_version,
        status=VersionStatus.PENDING,
        description=description,
        metadata=metadata or {},
        sha256=onnx_file.sha256,
        size_bytes=sum(f.size_bytes for f in files),
        created_by=actor.user,
        derived_from=parent,
        recipe=derivation.recipe if derivation else {},
        accuracy=derivation.accuracy if derivation else {},
        source_run_url=lineage.get("source_run_url", ""),
        source_commit=lineage.get("source_commit", ""),
        source_datasets=lineage.get("source_datasets", []),
    )
    ModelFile.objects.bulk_create(
        ModelFile(
            version=version,
            name=f.name,
            role=FileRole.MODEL if index == 0 else FileRole.EXTRA,
            storage_key=f.storage_key,
            sha256=f.sha256,
            size_bytes=f.size_bytes,
        )
        for index, f in enumerate(files)
    )
    after: dict[str, Any] = {
        "version": version.version,
        "sha256": version.sha256,
        "size_bytes": version.size_bytes,
        "files": [{"name": f.name, "sha256": f.sha256, "size_bytes": f.size_bytes} for f in files],
    }
    after.update(lineage)  # only the fields the upload set
    if signatures:
        signatures_record(version, signatures)
        after["signed_by"] = [{"name": s.signer, "key_id": s.key_id, "kind": s.kind} for s in signatures]
    if derivation is not None:
        after.update(derived_from=derivation.parent.version, recipe=derivation.recipe, job=derivation.job_id)
        finished = DeriveJob.objects.filter(pk=derivation.job_id, status=JobStatus.RUNNING).update(
            status=JobStatus.SUCCEEDED, result=version, finished_at=timezone.now(), error=""
        )
        if not finished:
            raise Conflict(f"derive job {derivation.job_id} is no longer running; its result is not recorded")
    audit_version(
        version,
        actor=actor,
        action="version.derive" if derivation else "version.upload",
        after=after,
    )
    return version


EDITABLE_VERSION_FIELDS = ("description", "tags")


@transaction.atomic(durable=True)
def version_update(
    *, version: ModelVersion, actor: Actor, lineage: Mapping[str, Any] | None = None, **changes: Any
) -> ModelVersion:
    """Edit a version's description and tags, and its lineage; its files and metadata never change.

    Only the fields whose value changes are written and audited (``version.update``, before and after);
    an edit that changes nothing writes nothing. ``lineage`` holds the lineage fields sent, as sent:
    checked, changed only by the uploader or an admin, and audited as ``version.lineage``
    (``registry.lifecycle.lineage.lineage_update``). Unknown fields are a bug.
    """
    unknown = set(changes) - set(EDITABLE_VERSION_FIELDS)
    if unknown:
        raise TypeError(f"version_update() got unexpected fields {sorted(unknown)}")
    version = (
        ModelVersion.objects.select_for_update(of=("self",))
        .select_related("model", "created_by", "derived_from")
        .get(pk=version.pk)
    )
    saved = lineage_update(version, lineage, actor=actor) if lineage else []
    changed = {name: list(value) if name == "tags" else value for name, value in changes.items()}
    changed = {name: value for name, value in changed.items() if getattr(version, name) != value}
    if not changed and not saved:
        return version
    before = {name: getattr(version, name) for name in changed}
    for name, value in changed.items():
        setattr(version, name, value)
    version.save(update_fields=[*changed, *saved])
    if changed:
        audit_version(
            version,
            actor=actor,
            action="version.update",
            before=before,
            after=changed,
        )
    return version
