"""Celery tasks: each loads a row by id, calls a service, and is safe to deliver twice."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

from registry import audit, promotions, services, work
from registry.models import ModelVersion
from storage import StorageUnavailable

logger = logging.getLogger(__name__)

MAX_VALIDATION_ATTEMPTS = 5


@shared_task(acks_late=True, reject_on_worker_lost=True, bind=True, max_retries=MAX_VALIDATION_ATTEMPTS)
def validate_version(self: Any, version_id: int) -> str:
    if not services.version_claim_for_validation(version_id=version_id, max_attempts=MAX_VALIDATION_ATTEMPTS):
        return "skipped"
    version = ModelVersion.objects.select_related("model").get(pk=version_id)
    try:
        result = work.validate_stored_version(version)
    except StorageUnavailable as exc:
        if services.version_release_claim(version_id=version_id, error=str(exc), give_up=MAX_VALIDATION_ATTEMPTS):
            raise self.retry(exc=exc, countdown=min(300, 5 * 2**self.request.retries)) from exc
        return "gave up"
    services.version_record_validation(version_id=version_id, result=result)
    return "done"


@shared_task
def sweep_stuck_versions() -> list[int]:
    """Re-queue validations whose task or worker was lost."""
    return services.version_requeue_stuck(pending_older_than=timedelta(minutes=5))


@shared_task
def expire_promotions() -> int:
    """Mark pending promotion requests past their deadline as expired."""
    return promotions.promotions_expire()


@shared_task
def collect_orphaned_artifacts(grace_seconds: int | None = None) -> list[str]:
    """Delete stored objects that no version references, once they are older than the grace period."""
    grace = settings.GC_GRACE_SECONDS if grace_seconds is None else grace_seconds
    return work.collect_orphans(grace=timedelta(seconds=grace))


@shared_task
def summarise_auth_failures() -> int:
    """Append the finished per-minute counts of failed authentications to the audit chain."""
    handled = total = audit.audit_auth_failures_summarise()
    while handled == audit.AUTH_FAILURE_BATCH:  # a full batch: more may be waiting
        handled = audit.audit_auth_failures_summarise()
        total += handled
    return total
