"""Archive, legal hold and delete: what happens to a version after its release.

- An archived version keeps its bytes but is hidden from lists and cannot be promoted, shadowed or
  rolled out until it is unarchived (maintainer).
- A held version (legal hold; admin or auditor, with a reason) cannot be deleted by anyone or any
  retention rule until the hold is released.
- Deleting (admin, with a reason) is refused while anything still uses the version
  (:func:`delete_refusals`). Otherwise it is two-phase, so that a crash between the database and
  the store loses nothing and leaks nothing: the row is marked deleted first, in the transaction
  that audits it, and becomes a tombstone (number, digests, who, when, why; the number is never
  reused); the files are removed from the store afterwards by :func:`version_purge`, which the
  periodic :func:`versions_purge_pending` retries until every object is gone. Until then the
  objects are a pending deletion, which the orphan collector (``registry/artifacts.py``) leaves to it.
- A model is deleted only when every version of it is (or it has none); its rows go, and the audit
  event keeps its tombstones' numbers and digests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from registry import queueing
from registry.access.auth import has_role
from registry.audit.chain import SYSTEM, Actor, audit_record, audit_version
from registry.errors import Conflict, InvalidInput, PermissionDenied
from registry.models import (
    ROLLOUT_LIVE,
    Alias,
    AliasRollout,
    AliasShadow,
    ModelVersion,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
)
from registry.serving import LoadState, fleet_list
from storage import StorageError, get_storage

__all__ = [
    "Uses",
    "archive_refusals",
    "delete_refusals",
    "model_delete",
    "uses_of",
    "version_archive",
    "version_delete",
    "version_hold",
    "version_purge",
    "version_release",
    "version_unarchive",
    "versions_purge_pending",
]

logger = logging.getLogger(__name__)

NEEDS_MAINTAINER = "archiving or unarchiving a version needs the maintainer or admin role"
NEEDS_ADMIN = "deleting a version needs the admin role"
NEEDS_ADMIN_MODEL = "deleting a model needs the admin role"
NEEDS_HOLD_ROLE = "placing or releasing a legal hold needs the admin or auditor role"
_STATES_THAT_SERVE = {LoadState.LOADING, LoadState.READY, LoadState.DRAINING}


def _label(version: ModelVersion) -> str:
    return f"version {version.version} of model '{version.model.name}'"


def _locked(version: ModelVersion) -> ModelVersion:
    """The version's row locked (its model's first, as alias moves lock it), read afresh."""
    RegisteredModel.objects.select_for_update().filter(pk=version.model_id).first()
    return ModelVersion.objects.select_for_update(of=("self",)).select_related("model").get(pk=version.pk)


def _require_reason(reason: str, what: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput(f"{what} needs a reason", detail={"field": "reason"})
    return reason


# --- What still uses a version ----------------------------------------------------------------------


@dataclass(frozen=True)
class Uses:
    """What uses each version of one model now, read in a fixed number of queries whatever its size.

    ``named``: aliases pointing at it, live rollouts (as candidate or base), running shadows and pending
    promotion requests, each a phrase; ``served``: the inference processes whose last report loads it.
    """

    named: dict[int, list[str]]
    served: dict[int, list[str]]

    def of(self, version: ModelVersion) -> list[str]:
        return self.named.get(version.pk, [])


def uses_of(model: RegisteredModel, *, fleet: bool = True) -> Uses:
    """Every use of every version of ``model`` (five queries; four without the ``fleet``, which archiving ignores)."""
    named: dict[int, list[str]] = {}

    def add(version_id: int | None, phrase: str) -> None:
        if version_id is not None:
            named.setdefault(version_id, []).append(phrase)

    for name, version_id in Alias.objects.filter(model=model).order_by("name").values_list("name", "version_id"):
        add(version_id, f"alias '{name}' points at it")
    rollouts = AliasRollout.objects.filter(alias__model=model, state__in=ROLLOUT_LIVE).select_related("alias")
    for rollout in rollouts.order_by("pk"):
        phrase = f"rollout {rollout.pk} on alias '{rollout.alias.name}' ({rollout.state}) uses it"
        for version_id in dict.fromkeys((rollout.version_id, rollout.base_version_id)):
            add(version_id, phrase)
    shadows = AliasShadow.objects.filter(alias__model=model, ended_at__isnull=True).select_related("alias")
    for shadow in shadows.order_by("pk"):
        add(shadow.version_id, f"a shadow on alias '{shadow.alias.name}' runs it")
    pending = PromotionRequest.objects.filter(alias__model=model, state=PromotionState.PENDING, version__isnull=False)
    for pk, version_id in pending.order_by("pk").values_list("pk", "version_id"):
        add(version_id, f"promotion request {pk} names it")
    # The fleet's last reports: a process that still loads or serves it (an offline one counts too, until
    # it has been gone long enough to be dropped from the fleet page).
    numbers = dict(model.versions.values_list("version", "pk"))
    served: dict[int, list[str]] = {}
    for worker in fleet_list() if fleet else []:
        for row in worker.loaded:
            if row.model == model.name and row.version in numbers and row.state in _STATES_THAT_SERVE:
                served.setdefault(numbers[row.version], []).append(
                    f"inference process {worker.worker_id} still serves it"
                )
    return Uses(named=named, served=served)


def archive_refusals(version: ModelVersion, uses: Uses | None = None) -> list[str]:
    """Why the version cannot be archived now (empty when it can); ``uses``: read once for many versions."""
    if version.deleted_at is not None:
        return ["it is deleted"]
    return (uses or uses_of(version.model, fleet=False)).of(version)


def delete_refusals(version: ModelVersion, uses: Uses | None = None) -> list[str]:
    """Why the version cannot be deleted now, each reason a phrase (empty when it can)."""
    if version.deleted_at is not None:
        return ["it is already deleted"]
    uses = uses or uses_of(version.model)
    reasons: list[str] = []
    if version.held_at is not None:
        by = version.held_by.username if version.held_by else "someone"
        reasons.append(
            f"it is under legal hold (by {by} since {version.held_at:%Y-%m-%d %H:%M} UTC: {version.hold_reason})"
        )
    return reasons + uses.of(version) + uses.served.get(version.pk, [])


def _refuse(version: ModelVersion, verb: str, reasons: list[str]) -> None:
    if reasons:
        raise Conflict(f"{_label(version)} cannot be {verb}: " + "; ".join(reasons), detail={"reasons": reasons})


# --- Archive ----------------------------------------------------------------------------------------


@transaction.atomic(durable=True)
def version_archive(*, version: ModelVersion, actor: Actor, reason: str = "") -> ModelVersion:
    """Hide a version from lists and from promotion, keeping its bytes; archiving it again changes nothing."""
    if actor is not SYSTEM and not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(NEEDS_MAINTAINER)
    version = _locked(version)
    _refuse(version, "archived", archive_refusals(version))
    if version.archived_at is not None:
        return version
    version.archived_at = timezone.now()
    version.archived_by = actor.user
    version.save(update_fields=["archived_at", "archived_by"])
    audit_version(version, actor=actor, action="version.archive", after={"reason": reason.strip()})
    return version


@transaction.atomic(durable=True)
def version_unarchive(*, version: ModelVersion, actor: Actor, reason: str = "") -> ModelVersion:
    """Bring an archived version back to lists and promotion; unarchiving an active one changes nothing."""
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(NEEDS_MAINTAINER)
    version = _locked(version)
    if version.deleted_at is not None:
        raise Conflict(f"{_label(version)} is deleted; its files are gone and it cannot be unarchived")
    if version.archived_at is None:
        return version
    before = {"archived_at": version.archived_at.isoformat()}
    version.archived_at = None
    version.archived_by = None
    version.save(update_fields=["archived_at", "archived_by"])
    audit_version(version, actor=actor, action="version.unarchive", before=before, after={"reason": reason.strip()})
    return version


# --- Legal hold -------------------------------------------------------------------------------------


@transaction.atomic(durable=True)
def version_hold(*, version: ModelVersion, actor: Actor, reason: str) -> ModelVersion:
    """Place a legal hold: nobody and no retention rule may delete the version until it is released."""
    if not has_role(actor.user, Role.AUDITOR):
        raise PermissionDenied(NEEDS_HOLD_ROLE)
    reason = _require_reason(reason, "a legal hold")
    version = _locked(version)
    if version.deleted_at is not None:
        raise Conflict(f"{_label(version)} is deleted; there is nothing left to hold")
    if version.held_at is not None:
        by = version.held_by.username if version.held_by else "someone"
        raise Conflict(f"{_label(version)} is already under legal hold (by {by}); release it first to change why")
    version.held_at = timezone.now()
    version.held_by = actor.user
    version.hold_reason = reason
    version.save(update_fields=["held_at", "held_by", "hold_reason"])
    audit_version(version, actor=actor, action="version.hold", after={"reason": reason})
    return version


@transaction.atomic(durable=True)
def version_release(*, version: ModelVersion, actor: Actor, reason: str) -> ModelVersion:
    """Release a legal hold."""
    if not has_role(actor.user, Role.AUDITOR):
        raise PermissionDenied(NEEDS_HOLD_ROLE)
    reason = _require_reason(reason, "releasing a legal hold")
    version = _locked(version)
    if version.held_at is None:
        raise Conflict(f"{_label(version)} is not under legal hold")
    before = {
        "held_at": version.held_at.isoformat(),
        "held_by": version.held_by.username if version.held_by else None,
        "reason": version.hold_reason,
    }
    version.held_at = None
    version.held_by = None
    version.hold_reason = ""
    version.save(update_fields=["held_at", "held_by", "hold_reason"])
    audit_version(version, actor=actor, action="version.release", before=before, after={"reason": reason})
    return version


# --- Delete -----------------------------------------------------------------------------------------


def _stored_keys(version: ModelVersion) -> list[str]:
    """Every object of the version in the store: its files and its signature bundles."""
    keys = list(version.files.order_by("pk").values_list("storage_key", flat=True))
    return keys + list(version.signatures.order_by("pk").values_list("storage_key", flat=True))


def version_delete(*, version: ModelVersion, actor: Actor, reason: str) -> ModelVersion:
    """Phase one: refuse, or mark the version deleted and audit it; then queue phase two, the files' removal.

    ``actor`` is an admin, or the retention job (``SYSTEM``) acting on a model's rule.
    """
    version = _version_mark_deleted(version=version, actor=actor, reason=reason)
    transaction.on_commit(lambda: queueing.purge_enqueue(version.pk))
    return version


@transaction.atomic
def _version_mark_deleted(*, version: ModelVersion, actor: Actor, reason: str) -> ModelVersion:
    if actor is not SYSTEM and not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(NEEDS_ADMIN)
    reason = _require_reason(reason, "deleting a version")
    version = _locked(version)
    _refuse(version, "deleted", delete_refusals(version))
    version.deleted_at = timezone.now()
    version.deleted_by = actor.user
    version.delete_reason = reason
    version.save(update_fields=["deleted_at", "deleted_by", "delete_reason"])
    files = [{"name": f.name, "sha256": f.sha256, "size_bytes": f.size_bytes} for f in version.files.order_by("pk")]
    audit_version(
        version,
        actor=actor,
        action="version.delete",
        before={"lifecycle": "archived" if version.archived_at else "active"},
        after={"reason": reason, "sha256": version.sha256, "files": files},
    )
    return version


def version_purge(version_id: int) -> bool:
    """Phase two: remove a deleted version's objects from the store, then record it; True once done.

    Safe to run twice or concurrently: deleting a missing object is not an error, and ``purged_at``
    is set once. A store that fails leaves the version pending, its attempts and last error recorded,
    for :func:`versions_purge_pending` to try again.
    """
    version = ModelVersion.objects.select_related("model").filter(pk=version_id, deleted_at__isnull=False).first()
    if version is None or version.purged_at is not None:
        return version is not None
    storage = get_storage()
    keys = _stored_keys(version)
    try:
        for key in keys:
            storage.delete(key)
    except StorageError as exc:
        ModelVersion.objects.filter(pk=version.pk).update(
            purge_attempts=version.purge_attempts + 1, purge_error=str(exc)[:2000]
        )
        logger.warning("could not remove the files of deleted %s yet: %s", _label(version), exc)
        return False
    with transaction.atomic():
        marked = ModelVersion.objects.filter(pk=version.pk, purged_at__isnull=True).update(
            purged_at=timezone.now(), purge_attempts=version.purge_attempts + 1, purge_error=""
        )
        if marked:
            audit_version(version, actor=SYSTEM, action="version.purge", after={"objects_removed": len(keys)})
    return True


def versions_pending_purge() -> list[int]:
    return list(
        ModelVersion.objects.filter(deleted_at__isnull=False, purged_at__isnull=True)
        .order_by("deleted_at")
        .values_list("pk", flat=True)
    )


def versions_purge_pending() -> list[int]:
    """Remove the files of every deleted version whose removal has not finished; the ids done now."""
    return [version_id for version_id in versions_pending_purge() if version_purge(version_id)]


# --- Models -----------------------------------------------------------------------------------------


def model_delete(*, model: RegisteredModel, actor: Actor, reason: str) -> None:
    """Delete a model whose versions are all deleted (or that has none): its rows go, the audit keeps its tombstones.

    The files of tombstones still pending removal are removed first; if the store refuses, nothing is deleted.
    """
    if not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(NEEDS_ADMIN_MODEL)
    reason = _require_reason(reason, "deleting a model")
    live = list(model.versions.filter(deleted_at__isnull=True).order_by("version").values_list("version", flat=True))
    if live:
        raise Conflict(
            f"model '{model.name}' still has versions that are not deleted: {_numbers(live)}; delete them first",
            detail={"versions": live},
        )
    for version_id in model.versions.filter(purged_at__isnull=True).values_list("pk", flat=True):
        if not version_purge(version_id):
            raise Conflict(
                f"the files of a deleted version of model '{model.name}' could not be removed from the store yet; "
                "try again later",
                detail={"store_error": ModelVersion.objects.get(pk=version_id).purge_error},
            )
    _model_delete_rows(model=model, actor=actor, reason=reason)


@transaction.atomic(durable=True)
def _model_delete_rows(*, model: RegisteredModel, actor: Actor, reason: str) -> None:
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    versions = list(model.versions.order_by("version"))
    if any(v.deleted_at is None for v in versions):  # one was uploaded meanwhile
        raise Conflict(f"model '{model.name}' has a new version; delete it first")
    tombstones = [
        {
            "version": v.version,
            "sha256": v.sha256,
            "deleted_at": v.deleted_at.isoformat() if v.deleted_at else None,
            "deleted_by": v.deleted_by.username if v.deleted_by else None,
            "reason": v.delete_reason,
        }
        for v in versions
    ]
    audit_record(
        actor=actor,
        action="model.delete",
        target_type="model",
        target=model.name,
        model_name=model.name,
        before={"description": model.description, "tags": model.tags, "versions": tombstones},
        after={"reason": reason},
    )
    # Aliases first: their history (moves), rollouts, shadows, policies and promotion requests go with them,
    # and with those gone nothing protects the versions.
    Alias.objects.filter(model=model).delete()
    PromotionRequest.objects.filter(version__model=model).delete()
    model.versions.all().delete()
    model.delete()


def _numbers(numbers: Iterable[int]) -> str:
    return ", ".join(str(n) for n in numbers)
