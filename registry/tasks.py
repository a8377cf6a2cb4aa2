"""Celery tasks: each loads a row by id, calls a service, and is safe to deliver twice.

This is the registry's top floor: the tasks import the wings' services, and nothing imports the
tasks. What queues one names it (``registry/queueing.py``: validations and derivations;
``registry.webhooks.services.DELIVER_TASK``), and the beat schedule names the periodic ones, so a
task keeps its name when its code moves (``derive_version`` keeps ``registry.derive_tasks.derive_version``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

from registry import artifacts, promotions, queueing, selectors
from registry.access import refusals
from registry.audit import heads as audit_heads
from registry.audit import verify as audit_verify
from registry.benchmarks import services as benchmarks
from registry.derive import job as derive_job
from registry.derive import services as derive
from registry.errors import StorageDown
from registry.jobs import services as inference_jobs
from registry.lifecycle import retention
from registry.lifecycle import services as lifecycle
from registry.models import ModelVersion
from registry.provenance import services as provenance
from registry.rollout import services as rollouts
from registry.validation import job as validation_job
from registry.validation import services as validation
from registry.webhooks import services as webhooks
from storage import StorageUnavailable

MAX_VALIDATION_ATTEMPTS = 5


@shared_task(
    name=queueing.VALIDATE_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    bind=True,
    max_retries=MAX_VALIDATION_ATTEMPTS,
)
def validate_version(self: Any, version_id: int) -> str:
    if not validation.version_claim_for_validation(version_id=version_id, max_attempts=MAX_VALIDATION_ATTEMPTS):
        return "skipped"
    version = ModelVersion.objects.select_related("model").get(pk=version_id)
    try:
        result = validation_job.validate_stored_version(version)
        # Signed before the outcome is recorded, which records the bundles' rows: a ready version is a signed one.
        signed = provenance.version_sign(version) if result.ok else []
    except StorageUnavailable as exc:
        if validation.version_release_claim(version_id=version_id, error=str(exc), give_up=MAX_VALIDATION_ATTEMPTS):
            raise self.retry(exc=exc, countdown=min(300, 5 * 2**self.request.retries)) from exc
        return "gave up"
    # Decided meanwhile (None): the bundles are no one's, and the orphan collector removes them.
    validation.version_record_validation(version_id=version_id, result=result, signatures=signed)
    return "done"


@shared_task
def sweep_stuck_versions(pending_older_than_seconds: int = 300) -> list[int]:
    """Re-queue validations whose task or worker was lost."""
    ids = selectors.version_stuck_ids(pending_older_than=timedelta(seconds=pending_older_than_seconds))
    for version_id in ids:
        queueing.validation_requeue(version_id)
    return ids


@shared_task
def recheck_batching() -> list[int]:
    """Validation's batching check for ready versions validated before it existed, a few per run.

    The check needs what validation builds (the session, the inputs, the time left), so the stored files
    are validated again in the sandbox; only the verdict is recorded.
    """
    ids = selectors.version_batch_unchecked_ids(limit=settings.BATCH_RECHECK_PER_RUN)
    for version_id in ids:
        version = ModelVersion.objects.select_related("model").get(pk=version_id)
        try:
            result = validation_job.validate_stored_version(version, keep_claim=False)
        except StorageUnavailable:
            continue  # the next run tries again
        validation.version_record_batch_check(version_id=version_id, result=result)
    return ids


# A job still running this long past its own limit was lost with its worker.
LOST_JOB_GRACE_SECONDS = 600


@shared_task
def fail_lost_jobs() -> dict[str, list[int]]:
    """Fail derive jobs and benchmarks whose worker died mid-run (each child is bounded, so they never end)."""
    grace = timedelta(seconds=LOST_JOB_GRACE_SECONDS)
    return {
        "derive": derive.derive_jobs_fail_lost(older_than=timedelta(seconds=settings.DERIVE_TIMEOUT_SECONDS) + grace),
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


@shared_task(name=queueing.PURGE_TASK, acks_late=True, reject_on_worker_lost=True)
def purge_deleted_version(version_id: int) -> bool:
    """Phase two of a version's deletion: remove its files from the store (safe to deliver twice)."""
    return lifecycle.version_purge(version_id)


@shared_task
def purge_deleted_versions() -> list[int]:
    """Finish the removal of every deleted version's files that a failure or a lost task left pending."""
    return lifecycle.versions_purge_pending()


@shared_task
def apply_retention() -> dict[str, list[dict[str, Any]]]:
    """Archive or delete what each model's retention rule no longer keeps; what it did, by model."""
    done = retention.retention_apply_all()
    return {name: [action.as_json() for action in actions] for name, actions in done.items() if actions}


@shared_task
def summarise_auth_failures() -> int:
    """Append the finished per-minute counts of failed authentications to the audit chain."""
    handled = total = refusals.audit_auth_failures_summarise()
    while handled == refusals.AUTH_FAILURE_BATCH:  # a full batch: more may be waiting
        handled = refusals.audit_auth_failures_summarise()
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


@shared_task
def sign_audit_head() -> int | None:
    """Sign the audit chain's head when it moved since the last signed head; the seq it covers, if any."""
    signature = audit_heads.audit_head_sign(max_events=settings.AUDIT_VERIFY_MAX_EVENTS).signature
    return signature.seq if signature is not None else None


@shared_task(name=queueing.DERIVE_TASK, acks_late=True, reject_on_worker_lost=True, bind=True)
def derive_version(self: Any, job_id: int) -> str:
    """Build the derived version of one derive job (claimed once, however often delivered)."""
    return derive_job.run_derive_job(job_id)


@shared_task
def advance_rollouts() -> dict[int, str]:
    """Check every running rollout once: roll back a breach, pass a step that has run its time."""
    return rollouts.rollouts_advance()


@shared_task(name=queueing.PREPARE_JOB_TASK, acks_late=True, reject_on_worker_lost=True, bind=True, max_retries=5)
def prepare_inference_job(self: Any, job_id: int) -> str:
    """Split a queued inference job's input into chunks (taken once, however often delivered)."""
    try:
        return inference_jobs.job_prepare(job_id)
    except StorageDown as exc:
        raise self.retry(exc=exc, countdown=min(300, 5 * 2**self.request.retries)) from exc


@shared_task(name=queueing.FINISH_JOB_TASK, acks_late=True, reject_on_worker_lost=True, bind=True, max_retries=5)
def finish_inference_job(self: Any, job_id: int) -> str:
    """Assemble a job's result from its chunks' outputs and end it (taken once, however often delivered)."""
    try:
        return inference_jobs.job_finish(job_id)
    except StorageDown as exc:
        raise self.retry(exc=exc, countdown=min(300, 5 * 2**self.request.retries)) from exc


@shared_task
def sweep_inference_jobs() -> dict[str, list[Any]]:
    """Delete expired infer-async answers and job results; queue again a preparation or finish that was lost."""
    swept = inference_jobs.jobs_sweep()
    return {"expired": swept.expired, "prepare": swept.prepare, "finish": swept.finish, "orphaned": swept.orphaned}
