"""Derive jobs in the registry: asking for a derived version (check the recipe, record the job, queue it
after commit), and the job row's claim and failure.

The job itself (``registry/derive/job.py``) runs in the Celery task ``registry.tasks.derive_version``,
or in the embedded default on an in-process job thread (``registry.queueing.derive_enqueue``), so the
request answers 202 at once.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from onnxkit import derive
from registry import queueing
from registry.audit.chain import SYSTEM, Actor, audit_version
from registry.errors import Conflict, InvalidInput
from registry.models import DeriveJob, JobStatus, ModelVersion, VersionStatus


@transaction.atomic(durable=True)
def derive_request(*, version: ModelVersion, recipe: Any, options: Any, actor: Actor) -> DeriveJob:
    """Record a derive job for a ready version and queue it once this commits."""
    try:
        checked = derive.check_recipe(
            recipe,
            options,
            max_items=settings.DERIVE_MAX_OPTION_ITEMS,
            max_item_chars=settings.DERIVE_MAX_OPTION_ITEM_CHARS,
        )
    except derive.RecipeError as exc:
        raise InvalidInput(str(exc)) from exc
    version = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
    if version.deleted_at is not None:
        raise Conflict(f"version {version.version} is deleted; its files are gone and nothing can be derived from it")
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"version {version.version} is {version.status}; only a ready version can be derived from",
            detail={"status": version.status},
        )
    job = DeriveJob.objects.create(source=version, recipe=recipe, options=checked, requested_by=actor.user)
    audit_version(
        version,
        actor=actor,
        action="version.derive.request",
        after={"job": job.pk, "recipe": recipe, "options": checked},
    )
    transaction.on_commit(partial(queueing.derive_enqueue, job.pk))
    return job


def derive_claim(*, job_id: int) -> bool:
    """Take a pending derive job; False when another delivery of the task already took it."""
    return bool(
        DeriveJob.objects.filter(pk=job_id, status=JobStatus.PENDING).update(
            status=JobStatus.RUNNING, started_at=timezone.now()
        )
    )


@transaction.atomic(durable=True)
def derive_fail(*, job_id: int, error: str) -> None:
    """Record why a running derive job produced no version."""
    job = DeriveJob.objects.select_related("source__model").filter(pk=job_id, status=JobStatus.RUNNING).first()
    if job is None:
        return
    job.status, job.error, job.finished_at = JobStatus.FAILED, error, timezone.now()
    job.save(update_fields=["status", "error", "finished_at"])
    audit_version(
        job.source,
        actor=SYSTEM,
        action="version.derive.fail",
        after={"job": job.pk, "recipe": job.recipe, "error": error},
    )


def derive_jobs_fail_lost(*, older_than: timedelta) -> list[int]:
    """Fail the derive jobs still ``running`` long past their limit: the worker running them was lost."""
    before = timezone.now() - older_than
    lost = list(DeriveJob.objects.filter(status=JobStatus.RUNNING, started_at__lt=before).values_list("pk", flat=True))
    for job_id in lost:
        derive_fail(
            job_id=job_id,
            error="the derivation was lost: the worker running it stopped before it finished; derive again",
        )
    return lost
