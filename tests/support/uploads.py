"""Uploads through the upload service itself (no HTTP), and what they leave in storage."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from django.test import TestCase

from registry.audit.chain import Actor
from registry.models import ModelVersion, RegisteredModel
from registry.uploads import LocalUpload, version_upload
from storage import get_storage


def stored_keys() -> list[str]:
    """Every object in the artifact storage, in key order."""
    return sorted(item.key for item in get_storage().list(""))


def upload_local(
    model: str, parts: Sequence[tuple[str, bytes | Path | BinaryIO]], *, actor: Actor, **fields: Any
) -> ModelVersion:
    """``version_upload`` of local files; the validation it queues runs as a test's transaction would commit."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        version = version_upload(
            model=RegisteredModel.objects.get(name=model), source=LocalUpload(parts, **fields), actor=actor
        )
    version.refresh_from_db()
    return version
