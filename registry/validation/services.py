"""A version's validation in the registry: the claim a validation takes, its heartbeat, and the outcome it
records (with the ``version.validate`` audit event, the benchmark rows of a ready version and the
webhook event). The validation itself is ``registry/validation/job.py``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from onnxkit.validation import BATCH_UNCHECKED, ValidationResult
from registry.audit.chain import SYSTEM, audit_version
from registry.benchmarks.services import benchmarks_request
from registry.models import FileRole, ModelVersion, VersionStatus, WebhookEvent
from registry.provenance.services import SignedBundle, signatures_record
from registry.serving import fleet_providers
from registry.webhooks import services as webhooks


def version_claim_for_validation(*, version_id: int, max_attempts: int) -> bool:
    """Move a version to ``validating`` if it is pending, or if its validator stopped heartbeating.

    Returns False when another live worker holds it or it is already decided, which makes a
    task that is delivered twice harmless. Each claim counts as an attempt. A version whose
    ``max_attempts`` are spent is not claimed again but ends ``failed``: an attempt that left it
    claimable never finished (its worker was killed, say), and a poison model would otherwise be
    redelivered and swept back for ever.
    """
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.VALIDATION_STALE_SECONDS)
    claimable = ModelVersion.objects.filter(
        Q(status=VersionStatus.PENDING) | Q(status=VersionStatus.VALIDATING, validation_heartbeat_at__lt=stale_before),
        pk=version_id,
    )
    claimed = claimable.filter(validation_attempts__lt=max_attempts).update(
        status=VersionStatus.VALIDATING,
        validation_started_at=now,
        validation_heartbeat_at=now,
        validation_attempts=F("validation_attempts") + 1,
    )
    if claimed:
        return True
    # Claimed once more only to record the end, so two deliveries cannot both record it.
    if claimable.update(status=VersionStatus.VALIDATING, validation_heartbeat_at=now):
        attempts = ModelVersion.objects.values_list("validation_attempts", flat=True).get(pk=version_id)
        error = (
            f"validation gave up after {attempts} attempts: the last one never finished, because the process "
            "validating it was lost (killed, or restarted)"
        )
        version_record_validation(version_id=version_id, result=ValidationResult(errors=[error]))
    return False


def version_release_claim(*, version_id: int, error: str, give_up: int) -> bool:
    """Hand a claimed version back after a transient error; returns False once it has failed for good.

    After ``give_up`` attempts the version ends ``failed`` instead, so none stays pending forever.
    """
    version = ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).first()
    if version is None:
        return False
    if version.validation_attempts >= give_up:
        result = ValidationResult(errors=[f"validation gave up after {version.validation_attempts} attempts: {error}"])
        version_record_validation(version_id=version_id, result=result)
        return False
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(status=VersionStatus.PENDING)
    return True


def version_validation_heartbeat(*, version_id: int) -> None:
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
        validation_heartbeat_at=timezone.now()
    )


@transaction.atomic(durable=True)
def version_record_validation(
    *, version_id: int, result: ValidationResult, signatures: Sequence[SignedBundle] = ()
) -> ModelVersion | None:
    """Store the validation outcome, and the registry's ``signatures`` of a ready version; a decided version stays."""
    version = (
        ModelVersion.objects.select_for_update()
        .select_related("model")
        .filter(pk=version_id, status=VersionStatus.VALIDATING)
        .first()
    )
    if version is None:
        return None
    version.status = VersionStatus.READY if result.ok else VersionStatus.FAILED
    version.errors = result.errors
    version.warnings = result.warnings
    version.signature = result.signature
    version.ir_version = result.ir_version
    version.opset = result.opset
    version.producer = result.producer
    version.batch_check = result.batch_check
    version.batch_note = result.batch_note
    version.validated_at = timezone.now()
    version.save()
    if result.ok:
        signatures_record(version, signatures)
    if result.ok:  # benchmarked on the serving hardware: inference processes take these rows
        benchmarks_request(version, providers=fleet_providers())
    if result.external_data_files:
        version.files.filter(name__in=result.external_data_files, role=FileRole.EXTRA).update(
            role=FileRole.EXTERNAL_DATA
        )
    audit_version(
        version,
        actor=SYSTEM,
        action="version.validate",
        before={"status": VersionStatus.VALIDATING},
        after={"status": version.status, "errors": result.errors},
    )
    webhooks.emit(
        WebhookEvent.VERSION_READY if result.ok else WebhookEvent.VERSION_FAILED,
        model=version.model,
        version=version.version,
        details={
            "status": version.status,
            "sha256": version.sha256,
            "size_bytes": version.size_bytes,
            "signature": version.signature,
            "errors": version.errors,
            "warnings": version.warnings,
        },
    )
    return version


@transaction.atomic(durable=True)
def version_record_batch_check(*, version_id: int, result: ValidationResult) -> ModelVersion | None:
    """Store the batching verdict found for a ready version validated before the check existed.

    Only the verdict changes (status, signature and errors stay as recorded at upload); a version that
    has a verdict already, or is no longer ready, is left alone, so a second delivery writes nothing.
    """
    version = (
        ModelVersion.objects.select_for_update()
        .select_related("model")
        .filter(pk=version_id, status=VersionStatus.READY, batch_check=BATCH_UNCHECKED, batch_note="")
        .first()
    )
    if version is None:
        return None
    if not result.ok:
        check, note = BATCH_UNCHECKED, f"the batching check could not run: validation now says: {result.errors[0]}"
    else:
        check, note = result.batch_check, result.batch_note or "the batching check could not run"
    version.batch_check, version.batch_note = check, note
    version.save(update_fields=["batch_check", "batch_note"])
    audit_version(
        version,
        actor=SYSTEM,
        action="version.batch_check",
        before={"batch_check": BATCH_UNCHECKED},
        after={"batch_check": check, "batch_note": note},
    )
    return version
