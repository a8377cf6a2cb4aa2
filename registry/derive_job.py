"""One derive job: fetch the parent's files, build and measure the derived model in a child, upload the result.

The result becomes a version through ``registry.uploads.version_upload`` like any upload: the same
checks, then validation. It carries ``derived_from``, the recipe (with its options and the library
versions that built it) and the accuracy delta, and the same transaction marks the job succeeded.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from onnxkit.sandbox import CUDA_ENV, ChildLimits, run_in_child
from onnxkit.validation import SAMPLE_INPUTS, readable
from registry import services
from registry.audit import SYSTEM, Actor
from registry.errors import RegistryError
from registry.models import DeriveJob, FileRole
from registry.uploads import LocalUpload, version_upload
from registry.validation_job import fetch_version_files
from storage import ObjectNotFound, StorageUnavailable

logger = logging.getLogger(__name__)

TIMEOUT_SETTING = "MODELYARD_DERIVE_TIMEOUT_SECONDS"
MEMORY_SETTING = "MODELYARD_DERIVE_MEMORY_MB"


def derive_limits() -> ChildLimits:
    return ChildLimits(
        timeout_seconds=settings.DERIVE_TIMEOUT_SECONDS,
        memory_mb=settings.DERIVE_MEMORY_MB,
        timeout_setting=TIMEOUT_SETTING,
        memory_setting=MEMORY_SETTING,
        what="derivation",
        inherit_env=CUDA_ENV,
    )


def run_derive_job(job_id: int) -> str:
    """Claim the job, build its version, record the outcome; safe to call twice for one job."""
    if not services.derive_claim(job_id=job_id):
        return "skipped"
    job = DeriveJob.objects.select_related("source__model", "requested_by").get(pk=job_id)
    try:
        return _run(job)
    except StorageUnavailable as exc:
        services.derive_fail(job_id=job_id, error=f"artifact storage is unavailable: {exc}")
    except RegistryError as exc:  # the upload refused the result
        services.derive_fail(job_id=job_id, error=f"the derived model was refused: {exc.message}")
    except DatabaseError:
        raise
    except Exception as exc:
        logger.exception("derive job %s could not finish", job_id)
        services.derive_fail(
            job_id=job_id, error=f"the derivation could not finish: {type(exc).__name__}: {readable(str(exc))}"
        )
    return "failed"


def _run(job: DeriveJob) -> str:
    source = job.source
    work_root = Path(settings.VALIDATION_WORK_DIR)
    work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"derive{job.pk}-", dir=work_root) as tmp:
        parent_dir, out_dir = Path(tmp) / "parent", Path(tmp) / "out"
        parent_dir.mkdir()
        out_dir.mkdir()
        try:
            model_path = fetch_version_files(source, parent_dir)
        except ObjectNotFound as exc:
            services.derive_fail(job_id=job.pk, error=f"a stored file of the parent version is missing: {exc}")
            return "failed"
        samples = parent_dir / SAMPLE_INPUTS
        request: dict[str, Any] = {
            "recipe": job.recipe,
            "options": job.options,
            "model_path": str(model_path),
            "out_dir": str(out_dir),
            "samples_path": str(samples) if samples.is_file() else None,
            "signature": source.signature,
        }
        outcome = run_in_child("onnxkit.derive:derive_child", request, derive_limits())
        if not outcome.ok:
            services.derive_fail(job_id=job.pk, error=outcome.error)
            return "failed"
        reply = outcome.reply
        assert reply is not None
        accuracy = dict(reply["accuracy"])
        if "skipped" not in accuracy:
            accuracy["against"] = source.version
        # The result's files, then the parent's extras (tokenizer, labels, sample inputs) unchanged.
        parts: list[tuple[str, bytes | Path]] = [(name, out_dir / name) for name in _model_first(reply["files"])]
        taken = {name for name, _ in parts}
        extras = source.files.filter(role=FileRole.EXTRA).values_list("name", flat=True)
        parts += [(name, parent_dir / name) for name in extras if name not in taken]
        user = job.requested_by
        actor = Actor(user=user, label=user.get_username()) if user is not None else SYSTEM
        recipe = {"recipe": job.recipe, "options": job.options, "libraries": reply["libraries"]}
        derivation = services.Derivation(parent=source, recipe=recipe, accuracy=accuracy, job_id=job.pk)
        description = f"{job.recipe} of version {source.version}"
        version_upload(
            model=source.model,
            source=LocalUpload(parts=parts, description=description, metadata=dict(source.metadata)),
            actor=actor,
            derivation=derivation,
        )
    return "done"


def _model_first(names: list[str]) -> list[str]:
    from onnxkit.derive import RESULT_NAME

    return [RESULT_NAME, *[name for name in names if name != RESULT_NAME]]
