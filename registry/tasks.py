"""Celery tasks: each loads a row by id, calls a service, and is safe to deliver twice.

Validation is queued from here too (:func:`validation_enqueue`, :func:`validation_requeue`), beside
the task it queues: the upload service calls them, and this module imports the services, never the
other way round.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

from registry import (
    artifacts,
    audit,
    audit_verify,
    benchmarks,
    inprocess,
    promotions,
    selectors,
    services,
    validation_job,
    webhooks,
)
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
        result = validation_job.validate_stored_version(version)
    except StorageUnavailable as exc:
        if services.version_release_claim(version_id=version_id, error=str(exc), give_up=MAX_VALIDATION_ATTEMPTS):
            raise self.retry(exc=exc, countdown=min(300, 5 * 2**self.request.retries)) from exc
        return "gave up"
    services.version_record_validation(version_id=version_id, result=result)
    return "done"


@shared_task
def sweep_stuck_versions(pending_older_than_seconds: int = 300) -> list[int]:
    """Re-queue validations whose task or worker was lost."""
    ids = selectors.version_stuck_ids(pending_older_than=timedelta(seconds=pending_older_than_seconds))
    for version_id in ids:
        validation_requeue(version_id)
    return ids


# A job still running this long past its own limit was lost with its worker.
LOST_JOB_GRACE_SECONDS = 600


@shared_task
def fail_lost_jobs() -> dict[str, list[int]]:
    """Fail derive jobs and benchmarks whose worker died mid-run (each child is bounded, so they never end)."""
    grace = timedelta(seconds=LOST_JOB_GRACE_SECONDS)
    return {
        "derive": services.derive_jobs_fail_lost(older_than=timedelta(seconds=settings.DERIVE_TIMEOUT_SECONDS) + grace),
        "benchmarks": benchmarks.benchmarks_fail_lost(
            older_than=timedelta(seconds=settings.BENCHMARK_TIMEOUT_SECONDS) + grace
        ),
    }


@shared_task
def expire_promotions() -> int:
    """Mark pending promotion requests past their deadline as expired."""
    return promotions.promotions_expire()


@shared_task
def collect_orphaned_artifacts(grace_seconds: int | None = None) -> list[str]:
    """Delete stored objects that no version references, once they are older than the grace period."""
    grace = settings.GC_GRACE_SECONDS if grace_seconds is None else grace_seconds
    return artifacts.collect_orphans(grace=timedelta(seconds=grace))


@shared_task
def summarise_auth_failures() -> int:
    """Append the finished per-minute counts of failed authentications to the audit chain."""
    handled = total = audit.audit_auth_failures_summarise()
    while handled == audit.AUTH_FAILURE_BATCH:  # a full batch: more may be waiting
        handled = audit.audit_auth_failures_summarise()
        total += handled
    return total


@shared_task(acks_late=True, reject_on_worker_lost=True)
def deliver_webhook(delivery_id: int) -> str:
    """One attempt of one webhook delivery; a failure is retried later by :func:`retry_webhook_deliveries`."""
    return webhooks.delivery_attempt(delivery_id=delivery_id)


@shared_task
def retry_webhook_deliveries() -> list[int]:
    """Queue the webhook deliveries whose next attempt is due (retries, and any whose queueing was lost)."""
    due = webhooks.deliveries_due()
    webhooks.deliveries_queue(due)
    return due


@shared_task
def verify_audit_chain() -> bool:
    """Check the audit events appended since the last run; ``/metrics`` exports the verdict."""
    return audit_verify.audit_chain_check_run(max_events=settings.AUDIT_VERIFY_MAX_EVENTS).ok


# --- Queueing ------------------------------------------------------------------------------------


def validation_enqueue(version_id: int) -> None:
    """Queue a new version's validation; called once its row is committed.

    Nothing may escape: the upload has succeeded by now, and an error here (a broker that is
    down, or, without a broker, the in-process run itself) would turn it into a 500. The version
    stays ``pending`` (or ``validating`` with a heartbeat that goes stale) and the sweep queues it again.
    """
    try:
        validate_version.delay(version_id)
    except Exception:
        logger.exception("could not queue or run the validation of version %s; the sweep queues it again", version_id)


def validation_requeue(version_id: int) -> None:
    """Queue a validation that the sweep found lost.

    Without a broker Celery runs a task on the thread that sends it, here the embedded scheduler's,
    which would stop every other periodic job until the validation ended; the in-process validation
    thread runs it instead.
    """
    if validate_version.app.conf.task_always_eager:
        _validation_thread.submit(version_id)
    else:
        validation_enqueue(version_id)


def _validate_in_process(version_id: int) -> None:
    validate_version.apply(args=(version_id,))


_validation_thread = inprocess.JobThread(name="modelyard-validation", run=_validate_in_process)
