"""Asking for a derived version: check the recipe, record the job, queue it after commit.

The job itself (``registry/derive_job.py``) runs in a Celery task (``registry/derive_tasks.py``),
or in the embedded default on an in-process job thread, so the request answers 202 at once.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction

from onnxkit import derive
from registry import derive_tasks
from registry.audit import Actor, audit_record
from registry.errors import Conflict, InvalidInput
from registry.models import DeriveJob, ModelVersion, VersionStatus


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
    if version.status != VersionStatus.READY:
        raise Conflict(
            f"version {version.version} is {version.status}; only a ready version can be derived from",
            detail={"status": version.status},
        )
    job = DeriveJob.objects.create(source=version, recipe=recipe, options=checked, requested_by=actor.user)
    audit_record(
        actor=actor,
        action="version.derive.request",
        target_type="version",
        target=f"{version.model.name}/{version.version}",
        model_name=version.model.name,
        after={"job": job.pk, "recipe": recipe, "options": checked},
    )
    transaction.on_commit(partial(derive_tasks.derive_enqueue, job.pk))
    return job
