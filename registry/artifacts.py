"""Where a version's files live in artifact storage, and removing the objects no version references.

Every upload writes under a fresh prefix, ``artifacts/<model>/<upload id>/<file name>``: the random
upload id means no later upload can overwrite an earlier one's files, and an upload that fails
leaves objects only under its own prefix. Objects are referenced by ``ModelFile.storage_key``; an
object that no row references (an upload whose process died before its commit), or only a version
whose deletion has already removed its files (``purged_at``), is deleted by :func:`collect_orphans`
once it is older than the grace period. A deleted version's objects awaiting removal are left to
its purge (``registry/lifecycle/services.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import timedelta

from django.db import close_old_connections
from django.utils import timezone

from registry.models import ModelFile, VersionSignature
from storage import StorageError, get_storage

logger = logging.getLogger(__name__)

ARTIFACT_ROOT = "artifacts"


def upload_key_prefix(model_name: str, upload_id: str) -> str:
    """Where the files of one upload go."""
    return f"{ARTIFACT_ROOT}/{model_name}/{upload_id}"


def new_upload_prefix(model_name: str) -> str:
    """A prefix no other upload has used."""
    return upload_key_prefix(model_name, uuid.uuid4().hex)


def delete_quietly(keys: Iterable[str]) -> None:
    """Delete objects no version will reference; what cannot be deleted now, :func:`collect_orphans` deletes later."""
    storage = get_storage()
    for key in keys:
        try:
            storage.delete(key)
        except StorageError:
            pass


def collect_orphans(*, grace: timedelta) -> list[str]:
    """Delete objects under :data:`ARTIFACT_ROOT` that no version references, once they are older than ``grace``."""
    storage = get_storage()
    cutoff = timezone.now() - grace
    deleted: list[str] = []
    batch: list[str] = []

    def flush() -> None:
        # A live version's objects, and a deleted one's until its purge has removed them (a pending
        # deletion, which the purge finishes); a purged version's objects are no one's.
        kept = {"storage_key__in": batch, "version__purged_at__isnull": True}
        referenced = set(ModelFile.objects.filter(**kept).values_list("storage_key", flat=True))
        referenced |= set(VersionSignature.objects.filter(**kept).values_list("storage_key", flat=True))
        for key in batch:
            if key not in referenced:
                storage.delete(key)
                deleted.append(key)
        batch.clear()

    for item in storage.list(f"{ARTIFACT_ROOT}/"):
        if item.last_modified < cutoff:
            batch.append(item.key)
        if len(batch) >= 500:
            flush()
    if batch:
        flush()
    close_old_connections()
    if deleted:
        logger.info("deleted %d orphaned artifact objects", len(deleted))
    return deleted
