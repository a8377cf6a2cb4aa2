"""One validation of a stored version: fetch its files, validate them in the sandbox, keep the claim alive.

The ``validate_version`` task (``registry/tasks.py``) claims the version
(``registry/validation/services.py``), calls :func:`validate_stored_version`, and records what it
returns. The checks themselves are ``onnxkit.validation``, run in ``onnxkit.sandbox`` under
``MODELYARD_VALIDATION_TIMEOUT_SECONDS`` and ``MODELYARD_VALIDATION_MEMORY_MB``.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection

from onnxkit.validation import ValidationResult, readable, validate_in_child
from registry.models import FileRole, ModelVersion
from registry.validation import services
from storage import ObjectNotFound, StorageUnavailable, get_storage
from storage.base import copy_stream

logger = logging.getLogger(__name__)


@contextmanager
def heartbeat(version_id: int) -> Iterator[None]:
    """Keep the version's validation claim fresh while the body runs."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(settings.VALIDATION_HEARTBEAT_SECONDS):
                services.version_validation_heartbeat(version_id=version_id)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"heartbeat-{version_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fetch_version_files(version: ModelVersion, target: Path) -> Path:
    """Stream every file of the version into ``target``; returns the .onnx path."""
    storage = get_storage()
    model_path: Path | None = None
    for item in version.files.all():
        path = target / item.name
        with storage.open(item.storage_key) as source, path.open("wb") as out:
            copy_stream(source, out)
        if item.role == FileRole.MODEL:
            model_path = path
    if model_path is None:
        raise RuntimeError(f"{version} has no model file")
    return model_path


def validate_stored_version(version: ModelVersion, *, keep_claim: bool = True) -> ValidationResult:
    """Fetch the version's files and validate them in a child process under the configured limits.

    Every outcome is a result to record, except the two that may pass: storage that cannot be
    reached (the caller retries) and a database error (the version stays claimed and the sweep
    takes it over once its heartbeat is stale, within the attempt limit). ``keep_claim=False`` is a
    ready version validated again for what the checks of this release find (``tasks.recheck_batching``),
    which holds no claim to keep alive.
    """
    try:
        if not keep_claim:
            return _validate_files(version)
        with heartbeat(version.pk):
            return _validate_files(version)
    except (StorageUnavailable, DatabaseError):
        raise
    except Exception as exc:  # anything else would fail again on every retry: record it
        logger.exception("validation of version %s could not finish", version.pk)
        return ValidationResult(errors=[f"validation could not finish: {type(exc).__name__}: {readable(str(exc))}"])


def _validate_files(version: ModelVersion) -> ValidationResult:
    work_root = Path(settings.VALIDATION_WORK_DIR)
    work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"v{version.pk}-", dir=work_root) as tmp:
        try:
            model_path = fetch_version_files(version, Path(tmp))
        except ObjectNotFound as exc:
            return ValidationResult(errors=[f"a stored file of this version is missing from storage: {exc}"])
        names = {item.name for item in version.files.all()}
        return validate_in_child(
            model_path,
            names,
            timeout_seconds=settings.VALIDATION_TIMEOUT_SECONDS,
            memory_mb=settings.VALIDATION_MEMORY_MB,
            tokenizer_max_bytes=settings.TOKENIZER_MAX_BYTES,
        )
