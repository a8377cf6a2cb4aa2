"""Shadow traffic: a candidate version answers a sample of an alias's live requests on the side.

The registry keeps which candidate shadows which alias (``AliasShadow``) and merges what the inference
processes counted (``ShadowTally``, written with their heartbeats by ``registry.serving``) into one
report (``onnxkit.agreement``). The inference processes do the mirroring (``inference/shadow.py``):
after the primary has answered, never delaying or failing that answer.

Starting and ending a shadow needs the maintainer role and is audited (``alias.shadow_start``,
``alias.shadow_stop``). A promotion request for the shadowed version carries the report as it stood
(:func:`shadow_report_for`); moving the alias to the shadowed version ends the shadow
(:func:`shadow_end_promoted`, called inside the move's transaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from onnxkit.agreement import Tally
from registry import notify
from registry.access.auth import has_role
from registry.audit.chain import Actor, audit_record
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.models import Alias, AliasShadow, ModelVersion, RegisteredModel, Role, VersionStatus

__all__ = [
    "ShadowState",
    "shadow_current",
    "shadow_end_promoted",
    "shadow_report_for",
    "shadow_start",
    "shadow_state",
    "shadow_stop",
]

NEEDS_ROLE = "starting or stopping a shadow needs the maintainer or admin role"
PROMOTED = "promoted: the alias serves the candidate now"
_RELATED = ("alias__model", "alias__version", "version", "started_by", "ended_by")


@dataclass(frozen=True)
class ShadowState:
    """A shadow and its report merged over every process that mirrored it."""

    shadow: AliasShadow
    report: dict[str, Any]
    workers: int  # processes that reported counts

    def as_json(self) -> dict[str, Any]:
        shadow = self.shadow
        return {
            "id": shadow.pk,
            "model": shadow.alias.model.name,
            "alias": shadow.alias.name,
            "version": shadow.version.version,
            "serving": shadow.alias.version.version if shadow.alias.version else None,
            "sample": shadow.sample,
            "running": shadow.ended_at is None,
            "started_by": shadow.started_by.username,
            "started_at": shadow.started_at.isoformat(),
            "ended_at": shadow.ended_at.isoformat() if shadow.ended_at else None,
            "ended_by": shadow.ended_by.username if shadow.ended_by else None,
            "end_reason": shadow.end_reason,
            "workers": self.workers,
            "report": self.report,
        }


def _check_role(actor: Actor) -> None:
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(NEEDS_ROLE)


def _alias(model: RegisteredModel, name: str, *, lock: bool = False) -> Alias:
    aliases = Alias.objects.select_related("model", "version")
    if lock:
        aliases = aliases.select_for_update(of=("self",))
    alias = aliases.filter(model=model, name=name).first()
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{name}'")
    return alias


def _audit(actor: Actor, action: str, alias: Alias, before: Any, after: Any) -> None:
    audit_record(
        actor=actor,
        action=action,
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before=before,
        after=after,
    )


def _summary(shadow: AliasShadow) -> dict[str, Any]:
    return {"shadow": shadow.pk, "version": shadow.version.version, "sample": shadow.sample}


def _end(shadow: AliasShadow, *, by: Any, reason: str) -> None:
    shadow.ended_at = timezone.now()
    shadow.ended_by = by
    shadow.end_reason = reason
    shadow.save(update_fields=["ended_at", "ended_by", "end_reason"])


def _wake_fleet(alias: Alias) -> None:
    """Tell the inference processes at once (they poll too): the same notification an alias move sends."""
    payload = {"model": alias.model.name, "alias": alias.name, "shadow": True}
    transaction.on_commit(lambda: notify.publish(payload))


@transaction.atomic(durable=True)
def shadow_start(
    *, model: RegisteredModel, alias_name: str, version_number: int, sample: float, actor: Actor
) -> AliasShadow:
    """Mirror ``sample`` of the alias's requests to version ``version_number``; ends a shadow already running there."""
    _check_role(actor)
    if not 0 < sample <= 1:
        raise InvalidInput(f"sample must be above 0 and at most 1 (a share of the requests), not {sample:g}")
    alias = _alias(model, alias_name, lock=True)
    # Locked, as a deletion locks it: the version cannot be deleted while the shadow starts.
    version = ModelVersion.objects.select_for_update().filter(model=model, version=version_number).first()
    if version is None:
        raise NotFound(f"model '{model.name}' has no version {version_number}")
    if refusal := version.lifecycle_refusal("used as a shadow"):
        raise Conflict(refusal)
    if version.status != VersionStatus.READY:
        raise Conflict(f"version {version.version} is {version.status}; only a ready version can shadow an alias")
    if not alias.served:
        raise Conflict(f"alias '{alias.name}' is not served, so it has no requests to mirror; serve it first")
    if alias.version_id is None:
        raise Conflict(f"alias '{alias.name}' points to no version yet: there is nothing to compare against")
    if alias.version_id == version.pk:
        raise Conflict(f"alias '{alias.name}' serves version {version.version} already; shadow another version")
    running = AliasShadow.objects.select_for_update().filter(alias=alias, ended_at__isnull=True).first()
    before = None
    if running is not None:
        before = _summary(running)
        _end(running, by=actor.user, reason=f"replaced by a shadow of version {version.version}")
    shadow = AliasShadow.objects.create(alias=alias, version=version, sample=sample, started_by=actor.user)
    _audit(actor, "alias.shadow_start", alias, before, _summary(shadow))
    _wake_fleet(alias)
    return shadow


@transaction.atomic(durable=True)
def shadow_stop(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> AliasShadow:
    """End the alias's running shadow; its report stays readable."""
    _check_role(actor)
    alias = _alias(model, alias_name, lock=True)
    running = AliasShadow.objects.select_for_update().filter(alias=alias, ended_at__isnull=True).first()
    if running is None:
        raise NotFound(f"alias '{alias.name}' of model '{model.name}' has no running shadow")
    before = _summary(running)
    _end(running, by=actor.user, reason=reason or "stopped")
    _audit(actor, "alias.shadow_stop", alias, before, {"reason": running.end_reason})
    _wake_fleet(alias)
    return running


def shadow_end_promoted(alias: Alias, version: ModelVersion, actor: Actor) -> None:
    """Inside an alias move: a shadow of the version the alias now serves has nothing left to compare."""
    running = AliasShadow.objects.filter(alias=alias, ended_at__isnull=True, version=version).first()
    if running is None:
        return
    _end(running, by=actor.user, reason=PROMOTED)
    _audit(actor, "alias.shadow_stop", alias, _summary(running), {"reason": PROMOTED})


def shadow_state(shadow: AliasShadow) -> ShadowState:
    """The shadow with the sum of every process's tally."""
    tally = Tally()
    workers = 0
    # In a fixed order, the latest counts last: their last error and mismatch message are the report's.
    for row in shadow.tallies.order_by("updated_at", "worker_id"):
        tally.merge(row.tally)
        workers += 1
    return ShadowState(shadow=shadow, report=tally.report(), workers=workers)


def shadow_current(model: RegisteredModel, alias_name: str) -> ShadowState:
    """The alias's running shadow, else its last one; :class:`NotFound` when it never had one."""
    alias = _alias(model, alias_name)
    shadows = AliasShadow.objects.select_related(*_RELATED).filter(alias=alias)
    shadow = shadows.filter(ended_at__isnull=True).first() or shadows.order_by("-started_at", "-id").first()
    if shadow is None:
        raise NotFound(f"alias '{alias.name}' of model '{model.name}' has never been shadowed")
    return shadow_state(shadow)


def shadow_report_for(alias: Alias, version: ModelVersion) -> dict[str, Any] | None:
    """The report of the alias's latest shadow of ``version`` as it stands now (what a promotion request keeps)."""
    shadow = (
        AliasShadow.objects.select_related(*_RELATED)
        .filter(alias=alias, version=version)
        .order_by("-started_at", "-id")
        .first()
    )
    if shadow is None:
        return None
    state = shadow_state(shadow).as_json()
    state["as_of"] = timezone.now().isoformat()
    return state
