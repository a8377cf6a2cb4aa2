"""Aliases, promotion requests and their four-eyes review. Each top-level function owns its transaction.

A protected alias changes only with two people: moving it, unprotecting it and changing its
promotion policy all open a request that another approver decides, so nobody can unprotect an alias
(or loosen its policy) and then move it alone. Every move is checked against the alias's policy
(``registry/policy/``) when it is asked for, and a request again when it is approved.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from onnxkit.signatures import signature_diff
from registry import notify
from registry.access.auth import has_role
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.comparison import Comparison, policy_violations
from registry.errors import Conflict, ForceNeedsReason, ForceRequired, InvalidInput, NotFound, PermissionDenied
from registry.models import (
    PRODUCTION,
    ROLLOUT_LIVE,
    Alias,
    AliasMove,
    AliasMoveKind,
    AliasPolicy,
    AliasRollout,
    AliasShadow,
    AuditEvent,
    ModelVersion,
    PolicyState,
    PromotionKind,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
    RolloutState,
    VersionStatus,
    WebhookEvent,
)
from registry.policy.rules import PolicyCheck, policy_activate, policy_check
from registry.provenance.services import check_alias_signature, trusted_signer_names
from registry.rollout.state import rollout_begin, rollout_finish
from registry.shadow.services import shadow_end_promoted, shadow_report_for
from registry.webhooks import services as webhooks


@dataclass(frozen=True)
class AliasOutcome:
    """What a request to change an alias did: changed it, or opened a promotion request."""

    alias: Alias
    move: AliasMove | None = None
    promotion: PromotionRequest | None = None


def alias_create_defaults(*, model: RegisteredModel) -> None:
    """Every model starts with a protected, served ``production`` alias (inside the caller's transaction)."""
    Alias.objects.create(model=model, name=PRODUCTION, protected=True, served=True)


def _locked_model(model: RegisteredModel) -> RegisteredModel:
    return RegisteredModel.objects.select_for_update().get(pk=model.pk)


def _locked_alias(model: RegisteredModel, name: str, *, create: bool) -> Alias | None:
    aliases = Alias.objects.select_for_update(of=("self",)).select_related("version")
    if create:
        return aliases.get_or_create(model=model, name=name)[0]
    return aliases.filter(model=model, name=name).first()


def _version(model: RegisteredModel, number: int) -> ModelVersion:
    version = ModelVersion.objects.filter(model=model, version=number).first()
    if version is None:
        raise NotFound(f"model '{model.name}' has no version {number}")
    return version


def _alias_state(alias: Alias) -> dict[str, Any]:
    return {"version": alias.version.version if alias.version else None}


def _notify_after_commit(alias: Alias) -> None:
    payload = {
        "model": alias.model.name,
        "alias": alias.name,
        "version": alias.version.version if alias.version else None,
        "served": alias.served,
    }
    transaction.on_commit(partial(notify.publish, payload))


def _move(
    *,
    alias: Alias,
    to: ModelVersion,
    actor: Actor,
    kind: AliasMoveKind,
    reason: str,
    forced: bool = False,
    promotion: PromotionRequest | None = None,
    failing_rules: list[str] | None = None,
) -> AliasMove:
    check_alias_signature(alias, to)  # also at approval and rollback: the alias's requirement may be newer
    before = _alias_state(alias)
    move = AliasMove.objects.create(
        alias=alias,
        from_version=alias.version,
        to_version=to,
        kind=kind,
        reason=reason,
        forced=forced,
        moved_by=actor.user,
        moved_at=timezone.now(),
        promotion=promotion,
    )
    from_version = alias.version.version if alias.version else None
    alias.version = to
    alias.save(update_fields=["version", "updated_at"])
    shadow_end_promoted(alias, to, actor)
    audit_record(
        actor=actor,
        action="alias.rollback" if kind == AliasMoveKind.ROLLBACK else "alias.set",
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before=before,
        after={
            "version": to.version,
            "reason": reason,
            "forced": forced,
            "promotion": promotion.pk if promotion else None,
            **({"failing_rules": failing_rules} if failing_rules else {}),
        },
    )
    _notify_after_commit(alias)
    webhooks.emit(
        WebhookEvent.ALIAS_MOVED,
        model=alias.model,
        version=to.version,
        details={
            "alias": alias.name,
            "from_version": from_version,
            "to_version": to.version,
            "kind": kind,
            "reason": reason,
            "forced": forced,
            "moved_by": actor.name,
            "promotion": promotion.pk if promotion else None,
        },
    )
    return move


def move_alias(
    alias: Alias,
    to: ModelVersion,
    actor: Actor,
    kind: AliasMoveKind,
    reason: str,
    promotion: PromotionRequest | None = None,
) -> AliasMove:
    """Move the alias inside the caller's transaction (a rollout's last step): audited, notified, emitted."""
    return _move(alias=alias, to=to, actor=actor, kind=kind, reason=reason, promotion=promotion)


def check_candidate(
    alias: Alias, version: ModelVersion, *, force: bool, reason: str, requester: Any = None
) -> tuple[bool, PolicyCheck]:
    """What a direct set checks of a candidate (the alias's promotion policy): whether it was forced, and how."""
    check = policy_check(alias, version, requester=requester)
    return _gate(alias, version, check, force=force, reason=reason), check


def _gate(alias: Alias, version: ModelVersion, check: PolicyCheck, *, force: bool, reason: str) -> bool:
    """Refuse a candidate the policy fails, unless forced with a reason; returns whether it was forced.

    The built-in policy is enforced by the checks its settings always had (the same refusals); a
    written policy by its rules' results.
    """
    if check.policy.builtin:
        forced = _check_signature(alias, version, force=force, reason=reason)
        return _check_policy(alias, version, check.comparison, force=force, reason=reason) or forced
    failing = [r for r in check.results if r["name"] in check.failing]
    if not failing:
        return False
    if not force:
        why = "; ".join(f"{r['name']}: {r['why']}" for r in failing)
        raise ForceRequired(
            f"version {version.version} fails the policy of '{alias.name}' (policy {check.policy.number}): {why}.",
            detail={"policy": check.policy.number, "failing": check.failing, "rules": check.results},
        )
    if not reason.strip():
        raise ForceNeedsReason()
    return True


def promotion_ttl() -> datetime:
    """When a promotion request made now expires."""
    return timezone.now() + timedelta(seconds=settings.PROMOTION_TTL_SECONDS)


def promotion_withdrawn(promotion: PromotionRequest, actor: Actor, reason: str) -> None:
    """Cancel a pending request whose change was withdrawn another way (an aborted rollout); caller's transaction."""
    _decide(promotion, PromotionState.CANCELLED, actor, reason)


def emit_promotion(event: WebhookEvent, promotion: PromotionRequest, **details: Any) -> None:
    _emit_promotion(event, promotion, **details)


def _emit_promotion(event: WebhookEvent, promotion: PromotionRequest, **details: Any) -> None:
    webhooks.emit(
        event,
        model=promotion.alias.model,
        version=promotion.version.version if promotion.version else None,
        details={
            "promotion": promotion.pk,
            "kind": promotion.kind,
            "alias": promotion.alias.name,
            "requested_by": promotion.requested_by.get_username(),
            **details,
        },
    )


def _check_signature(alias: Alias, version: ModelVersion, *, force: bool, reason: str) -> bool:
    """Refuse a breaking signature change unless forced with a reason; returns whether it was forced."""
    if alias.version is None:
        return False
    breaking = signature_diff(alias.version.signature, version.signature)
    if not breaking:
        return False
    if not force:
        raise ForceRequired(
            f"version {version.version} is not compatible with version {alias.version.version} behind "
            f"'{alias.name}': {'; '.join(breaking)}.",
            detail={"breaking": breaking},
        )
    if not reason.strip():
        raise ForceNeedsReason()
    return True


POLICY_FIELDS = ("max_slowdown_percent", "min_cosine", "max_abs_diff")


def alias_policy(alias: Alias) -> dict[str, float | None]:
    return {name: getattr(alias, name) for name in POLICY_FIELDS}


def _check_policy(alias: Alias, version: ModelVersion, comparison: Comparison, *, force: bool, reason: str) -> bool:
    """Refuse a candidate that breaks the alias's speed or accuracy policy unless forced with a reason.

    ``comparison`` is the one the policy's evidence was read from (``PolicyCheck.comparison``).
    """
    policy = alias_policy(alias)
    if alias.version is None or all(value is None for value in policy.values()):
        return False
    violations = policy_violations(comparison, policy)
    if not violations:
        return False
    if not force:
        raise ForceRequired(
            f"version {version.version} breaks the policy of '{alias.name}' against version {alias.version.version}: "
            f"{'; '.join(violations)}.",
            detail={"policy": policy, "violations": violations},
        )
    if not reason.strip():
        raise ForceNeedsReason()
    return True


@transaction.atomic(durable=True)
def alias_set_policy(
    *, model: RegisteredModel, alias_name: str, actor: Actor, changes: dict[str, float | None]
) -> Alias:
    """Set or clear (None) an alias's promotion policy; admins only, audited."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise TypeError(f"alias_set_policy() got unexpected fields {sorted(unknown)}")
    alias = _admin_locked_alias(model, alias_name, actor, "policy")
    before = alias_policy(alias)
    for name, value in changes.items():
        setattr(alias, name, value)
    alias.save(update_fields=[*changes, "updated_at"])
    _audit_alias_setting(actor, "alias.policy", alias, before, alias_policy(alias))
    return alias


def _admin_locked_alias(model: RegisteredModel, alias_name: str, actor: Actor, setting: str) -> Alias:
    """The alias (made if new) under row locks on it and its model, for an admin to change ``setting``."""
    if not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(f"changing an alias's {setting} needs the admin role")
    locked = _locked_model(model)
    alias = _locked_alias(locked, alias_name, create=True)
    assert alias is not None
    alias.model = locked  # the audit event names it: no query for what is already here
    return alias


def _audit_alias_setting(actor: Actor, action: str, alias: Alias, before: Any, after: Any) -> None:
    audit_record(
        actor=actor,
        action=action,
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before=before,
        after=after,
    )


def alias_provenance(alias: Alias) -> dict[str, Any]:
    return {"require_signature": alias.require_signature, "trusted_signers": list(alias.trusted_signers or [])}


@transaction.atomic(durable=True)
def alias_set_provenance(
    *,
    model: RegisteredModel,
    alias_name: str,
    actor: Actor,
    require_signature: bool | None = None,
    trusted_signers: list[str] | None = None,
) -> Alias:
    """Require (or stop requiring) an uploader's signature on the alias, maybe by named signers; admins only, audited.

    Naming trusted signers implies requiring a signature. Each name must be one of MODELYARD_TRUSTED_SIGNERS.
    """
    alias = _admin_locked_alias(model, alias_name, actor, "signature requirement")
    before = alias_provenance(alias)
    if trusted_signers is not None:
        alias.trusted_signers = trusted_signer_names(trusted_signers)
        if alias.trusted_signers and require_signature is None:
            require_signature = True
    if require_signature is not None:
        alias.require_signature = require_signature
    alias.save(update_fields=["require_signature", "trusted_signers", "updated_at"])
    _audit_alias_setting(actor, "alias.provenance", alias, before, alias_provenance(alias))
    return alias


# The response cache's bounds (``inference/response_cache.py``): at least a KiB, at most a TiB, for a second to a week.
CACHE_MIN_BYTES = 1024
CACHE_MAX_BYTES = 2**40
CACHE_MAX_TTL_SECONDS = 7 * 24 * 3600


def cache_setting_problem(max_bytes: int, ttl_seconds: int) -> str:
    """Why a response cache setting is refused; empty when it is fine."""
    if not CACHE_MIN_BYTES <= max_bytes <= CACHE_MAX_BYTES:
        return f"cache max_bytes must be between {CACHE_MIN_BYTES} and {CACHE_MAX_BYTES}, not {max_bytes}"
    if not 1 <= ttl_seconds <= CACHE_MAX_TTL_SECONDS:
        return f"cache ttl_seconds must be between 1 and {CACHE_MAX_TTL_SECONDS}, not {ttl_seconds}"
    return ""


@transaction.atomic(durable=True)
def alias_set_cache(
    *, model: RegisteredModel, alias_name: str, actor: Actor, max_bytes: int | None, ttl_seconds: int | None
) -> Alias:
    """Turn the alias's response cache on (both bounds) or off (neither); admins only, audited.

    The inference processes take it on their next reconcile pass, woken by the alias-change notice.
    """
    if (max_bytes is None) != (ttl_seconds is None):
        raise InvalidInput("send the cache's max_bytes and ttl_seconds together, or null to turn it off")
    if max_bytes is not None and ttl_seconds is not None and (problem := cache_setting_problem(max_bytes, ttl_seconds)):
        raise InvalidInput(problem)
    alias = _admin_locked_alias(model, alias_name, actor, "response cache")
    before = alias.cache
    alias.cache_max_bytes, alias.cache_ttl_seconds = max_bytes, ttl_seconds
    alias.save(update_fields=["cache_max_bytes", "cache_ttl_seconds", "updated_at"])
    _audit_alias_setting(actor, "alias.cache", alias, before, alias.cache)
    _notify_after_commit(alias)
    return alias


@transaction.atomic(durable=True)
def alias_set(
    *, model: RegisteredModel, alias_name: str, version_number: int, actor: Actor, reason: str = "", force: bool = False
) -> AliasOutcome:
    """Point an alias at a ready version, or open a promotion request when the alias is protected."""
    model = _locked_model(model)
    version = _version(model, version_number)
    if refusal := version.lifecycle_refusal("set on an alias"):
        raise Conflict(refusal)
    if version.status != VersionStatus.READY:
        raise Conflict(f"version {version.version} is {version.status}; only a ready version can be set on an alias")
    alias = _locked_alias(model, alias_name, create=True)
    assert alias is not None
    if alias.version_id == version.pk:
        return AliasOutcome(alias=alias)
    check_alias_signature(alias, version)  # provenance is never forced
    check = policy_check(alias, version, requester=actor.user)
    forced = _gate(alias, version, check, force=force, reason=reason)
    failing = check.failing if forced else []
    if alias.protected:
        duplicate = alias.promotions.filter(state=PromotionState.PENDING, version=version).first()
        if duplicate is not None:
            raise Conflict(
                f"promotion request {duplicate.pk} for version {version.version} on '{alias.name}' is already pending",
                detail={"promotion": duplicate.pk},
            )
        promotion = PromotionRequest.objects.create(
            alias=alias,
            version=version,
            base_version=alias.version,
            reason=reason,
            force=forced,
            requested_by=actor.user,
            expires_at=timezone.now() + timedelta(seconds=settings.PROMOTION_TTL_SECONDS),
            shadow_report=shadow_report_for(alias, version),
            policy_results=check.as_json(),
        )
        audit_record(
            actor=actor,
            action="promotion.request",
            target_type="promotion",
            target=str(promotion.pk),
            model_name=model.name,
            before=_alias_state(alias),
            after={
                "alias": alias.name,
                "version": version.version,
                "reason": reason,
                "forced": forced,
                **({"failing_rules": failing} if failing else {}),
            },
        )
        _emit_promotion(
            WebhookEvent.PROMOTION_REQUESTED,
            promotion,
            reason=reason,
            forced=forced,
            base_version=alias.version.version if alias.version else None,
            expires_at=promotion.expires_at.isoformat(),
        )
        return AliasOutcome(alias=alias, promotion=promotion)
    move = _move(
        alias=alias,
        to=version,
        actor=actor,
        kind=AliasMoveKind.SET,
        reason=reason,
        forced=forced,
        failing_rules=failing,
    )
    return AliasOutcome(alias=alias, move=move)


@transaction.atomic(durable=True)
def alias_rollback(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> AliasMove:
    """Move an alias back to the version it pointed to before its last move."""
    model = _locked_model(model)
    alias = _locked_alias(model, alias_name, create=False)
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{alias_name}'")
    if alias.protected and not has_role(actor.user, Role.APPROVER):
        raise PermissionDenied(f"rolling back the protected alias '{alias_name}' needs the approver role")
    if not alias.protected and not has_role(actor.user, Role.MAINTAINER, Role.APPROVER):
        raise PermissionDenied(f"rolling back '{alias_name}' needs the maintainer or approver role")
    last = alias.moves.select_related("from_version").order_by("-moved_at", "-id").first()
    if last is None or last.from_version is None:
        raise Conflict(f"alias '{alias_name}' has no earlier version to roll back to")
    target = last.from_version
    if refusal := target.lifecycle_refusal("served again by a rollback"):
        raise Conflict(refusal)
    if target.status != VersionStatus.READY:
        raise Conflict(f"the previous version {target.version} is {target.status}; it cannot serve again")
    return _move(alias=alias, to=target, actor=actor, kind=AliasMoveKind.ROLLBACK, reason=reason)


@transaction.atomic(durable=True)
def alias_clear(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> Alias:
    """Point an unprotected alias at nothing (maintainer): what it served stops, and its versions may be deleted.

    Its history stays. A protected alias is unprotected first (with a second person's approval); an alias
    with a live rollout or a running shadow is refused until they end. Clearing an empty alias changes nothing.
    """
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(f"clearing alias '{alias_name}' needs the maintainer or admin role")
    model = _locked_model(model)
    alias = _locked_alias(model, alias_name, create=False)
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{alias_name}'")
    if alias.version is None:
        return alias
    if alias.protected:
        raise Conflict(
            f"alias '{alias_name}' is protected: unprotect it first (PATCH protected=false, approved by a second "
            "person), then clear it"
        )
    if AliasRollout.objects.filter(alias=alias, state__in=ROLLOUT_LIVE).exists():
        raise Conflict(f"alias '{alias_name}' has a rollout under way; abort it first")
    if AliasShadow.objects.filter(alias=alias, ended_at__isnull=True).exists():
        raise Conflict(f"a shadow runs on alias '{alias_name}'; stop it first")
    before = _alias_state(alias)
    alias.version = None
    alias.save(update_fields=["version", "updated_at"])
    audit_record(
        actor=actor,
        action="alias.clear",
        target_type="alias",
        target=f"{model.name}@{alias.name}",
        model_name=model.name,
        before=before,
        after={"version": None, "reason": reason},
    )
    _notify_after_commit(alias)
    return alias


@transaction.atomic(durable=True)
def alias_update_flags(
    *,
    model: RegisteredModel,
    alias_name: str,
    actor: Actor,
    protected: bool | None = None,
    served: bool | None = None,
    reason: str = "",
) -> AliasOutcome:
    """Change whether an alias is protected or served (admins only).

    Unprotecting a protected alias does not happen here: it opens an unprotect request that
    another approver must approve, like a move.
    """
    if not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied("changing an alias's protected or served flag needs the admin role")
    model = _locked_model(model)
    alias = _locked_alias(model, alias_name, create=True)
    assert alias is not None
    if protected is False and alias.protected:
        if served is not None:
            raise InvalidInput(
                "unprotecting a protected alias needs a second person's approval: send protected=false on its own"
            )
        return AliasOutcome(alias=alias, promotion=_request_unprotect(alias, actor, reason))
    _set_flags(alias, actor, protected=protected, served=served)
    return AliasOutcome(alias=alias)


def _set_flags(
    alias: Alias,
    actor: Actor,
    *,
    protected: bool | None,
    served: bool | None,
    promotion: PromotionRequest | None = None,
) -> None:
    before = {"protected": alias.protected, "served": alias.served}
    if protected is not None:
        alias.protected = protected
    if served is not None:
        alias.served = served
    alias.save(update_fields=["protected", "served", "updated_at"])
    after: dict[str, Any] = {"protected": alias.protected, "served": alias.served}
    if promotion is not None:
        after["promotion"] = promotion.pk
    audit_record(
        actor=actor,
        action="alias.flags",
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before=before,
        after=after,
    )
    _notify_after_commit(alias)


def _request_unprotect(alias: Alias, actor: Actor, reason: str) -> PromotionRequest:
    duplicate = alias.promotions.filter(state=PromotionState.PENDING, kind=PromotionKind.UNPROTECT).first()
    if duplicate is not None:
        raise Conflict(
            f"unprotect request {duplicate.pk} for '{alias.name}' is already pending",
            detail={"promotion": duplicate.pk},
        )
    promotion = PromotionRequest.objects.create(
        alias=alias,
        kind=PromotionKind.UNPROTECT,
        base_version=alias.version,
        reason=reason,
        requested_by=actor.user,
        expires_at=timezone.now() + timedelta(seconds=settings.PROMOTION_TTL_SECONDS),
    )
    audit_record(
        actor=actor,
        action="promotion.request",
        target_type="promotion",
        target=str(promotion.pk),
        model_name=alias.model.name,
        before={"protected": True},
        after={"alias": alias.name, "kind": PromotionKind.UNPROTECT, "protected": False, "reason": reason},
    )
    _emit_promotion(
        WebhookEvent.PROMOTION_REQUESTED,
        promotion,
        reason=reason,
        forced=False,
        base_version=alias.version.version if alias.version else None,
        expires_at=promotion.expires_at.isoformat(),
    )
    return promotion


def _locked_promotion(promotion_id: int) -> PromotionRequest:
    promotion = PromotionRequest.objects.select_related("alias__model").filter(pk=promotion_id).first()
    if promotion is None:
        raise NotFound(f"there is no promotion request {promotion_id}")
    _locked_model(promotion.alias.model)  # the same lock order as alias_set: model row first
    return (
        PromotionRequest.objects.select_for_update(of=("self",))
        .select_related("alias__model", "alias__version", "version", "base_version", "requested_by")
        .get(pk=promotion_id)
    )


def _noun(promotion: PromotionRequest) -> str:
    if promotion.kind == PromotionKind.POLICY:
        return "policy change"
    return "unprotect request" if promotion.kind == PromotionKind.UNPROTECT else "promotion"


# --- Who may be the second person ----------------------------------------------------------------------
#
# Four eyes need two people. One admin can make a second account (or take over someone's) and decide
# their own request with it; the audit log would then name the puppet. So a decision is refused from
# a user whose account the requester created, re-keyed (a set-password link, a password set, an API
# token made for them) or granted the approver or admin role within the request's lifetime: from as
# long before the request as it has to run, until the decision.

# What the requester did to the decider's account, by audit action, as the refusal says it.
_STAND_IN_ACTIONS = {
    "user.create": "created your account",
    "user.password.link": "made a set-password link for you",
    "user.password.change": "set your password",
    "token.create": "made an API token for you",
    "user.roles.grant": "granted you the {roles} role",
    "user.update": "made you a superuser",
}
_PRIVILEGED = {Role.ADMIN.value, Role.APPROVER.value}


def review_window_start(promotion: PromotionRequest) -> datetime:
    """Since when what the requester did to an approver's account matters to deciding this request."""
    return promotion.requested_at - (promotion.expires_at - promotion.requested_at)


def _names_since(user: Any, since: datetime) -> set[str]:
    """The user's name now and every name they had since ``since`` (an admin can rename a user)."""
    names = {user.get_username()}
    renames = AuditEvent.objects.filter(action="user.update", at__gte=since, after__has_key="username")
    for before, after in renames.order_by("-seq").values_list("before", "after"):
        old = (before or {}).get("username")
        if old and (after or {}).get("username") in names:
            names.add(old)
    return names


def _stand_in_what(event: AuditEvent) -> str | None:
    after = event.after if isinstance(event.after, dict) else {}
    if event.action == "user.roles.grant":
        roles = sorted(set(after.get("roles", [])) & _PRIVILEGED)
        return _STAND_IN_ACTIONS[event.action].format(roles=" and ".join(roles)) if roles else None
    if event.action == "user.update":
        return _STAND_IN_ACTIONS[event.action] if after.get("is_superuser") is True else None
    return _STAND_IN_ACTIONS[event.action]


def reviewer_conflict(promotion: PromotionRequest, user: Any) -> str | None:
    """Why ``user`` cannot be the second person on ``promotion`` although they hold the role, or None."""
    if user is None or promotion.requested_by_id == user.pk:
        return None
    since = review_window_start(promotion)
    names = _names_since(user, since)
    events = AuditEvent.objects.filter(actor_id=promotion.requested_by_id, at__gte=since).filter(
        Q(target_type="user", target__in=names, action__in=set(_STAND_IN_ACTIONS) - {"token.create"})
        | Q(action="token.create", after__user__in=names)
    )
    for event in events.order_by("seq"):
        what = _stand_in_what(event)
        if what is not None:
            requester, at = promotion.requested_by.get_username(), event.at.isoformat(timespec="seconds")
            return f"{requester} requested this {_noun(promotion)} and {what} ({at})"
    return None


def _check_reviewer(promotion: PromotionRequest, actor: Actor, verb: str) -> None:
    if not has_role(actor.user, Role.APPROVER):
        article = "an" if promotion.kind == PromotionKind.UNPROTECT else "a"
        raise PermissionDenied(f"to {verb} {article} {_noun(promotion)} you need the approver role")
    if actor.user is not None and promotion.requested_by_id == actor.user.pk:
        raise PermissionDenied(f"you requested this {_noun(promotion)}; another approver must {verb} it")
    if promotion.state != PromotionState.PENDING:
        raise Conflict(f"promotion request {promotion.pk} is already {promotion.state}")
    if promotion.expires_at <= timezone.now():
        raise Conflict(f"promotion request {promotion.pk} expired at {promotion.expires_at.isoformat()}")
    conflict = reviewer_conflict(promotion, actor.user)
    if conflict is not None:
        raise PermissionDenied(f"{conflict}; another approver must {verb} it")


_DECISION_ACTIONS: dict[str, str] = {
    PromotionState.APPROVED: "promotion.approve",
    PromotionState.REJECTED: "promotion.reject",
    PromotionState.CANCELLED: "promotion.cancel",
    PromotionState.EXPIRED: "promotion.expire",
}


# Decisions that webhooks hear of (a cancelled or expired request changes nothing anyone waits for).
_DECISION_EVENTS: dict[str, WebhookEvent] = {
    PromotionState.APPROVED: WebhookEvent.PROMOTION_APPROVED,
    PromotionState.REJECTED: WebhookEvent.PROMOTION_REJECTED,
}


def _decide(promotion: PromotionRequest, state: str, actor: Actor, reason: str) -> None:
    promotion.state = state
    promotion.decided_by = actor.user
    promotion.decided_at = timezone.now()
    promotion.decision_reason = reason
    promotion.save(update_fields=["state", "decided_by", "decided_at", "decision_reason"])
    audit_record(
        actor=actor,
        action=_DECISION_ACTIONS[state],
        target_type="promotion",
        target=str(promotion.pk),
        model_name=promotion.alias.model.name,
        before={"state": PromotionState.PENDING},
        after={"state": state, "reason": reason},
    )
    event = _DECISION_EVENTS.get(state)
    if event is not None:
        _emit_promotion(event, promotion, decided_by=actor.name, reason=reason)
    if promotion.kind == PromotionKind.POLICY and state != PromotionState.APPROVED:
        AliasPolicy.objects.filter(promotion=promotion, state=PolicyState.PENDING).update(state=PolicyState.REJECTED)
    if promotion.kind == PromotionKind.ROLLOUT and state != PromotionState.APPROVED:
        rollout = _pending_rollout(promotion)
        if rollout is not None:
            rollout_finish(
                rollout, RolloutState.REJECTED, actor, f"its promotion request was {state}", "rollout.reject"
            )


def _pending_rollout(promotion: PromotionRequest) -> AliasRollout | None:
    return (
        AliasRollout.objects.select_for_update(of=("self",))
        .select_related("alias__model", "version", "base_version", "started_by")
        .filter(promotion=promotion, state=RolloutState.PENDING)
        .first()
    )


@transaction.atomic(durable=True)
def promotion_approve(*, promotion_id: int, actor: Actor, reason: str = "") -> PromotionRequest:
    """A second person approves: the alias moves (or loses its protection) in this same transaction."""
    promotion = _locked_promotion(promotion_id)
    _check_reviewer(promotion, actor, "approve")
    alias = promotion.alias
    if promotion.kind == PromotionKind.UNPROTECT:
        if not alias.protected:
            raise Conflict(f"alias '{alias.name}' is no longer protected; nothing to approve")
        _decide(promotion, PromotionState.APPROVED, actor, reason)
        _set_flags(alias, actor, protected=False, served=None, promotion=promotion)
        return promotion
    if promotion.kind == PromotionKind.POLICY:
        pending = AliasPolicy.objects.select_for_update().filter(promotion=promotion, state=PolicyState.PENDING).first()
        if pending is None:
            raise Conflict(f"the policy of promotion request {promotion.pk} is no longer pending")
        _decide(promotion, PromotionState.APPROVED, actor, reason)
        pending.alias = alias  # locked with its model above; the audit event names it
        policy_activate(pending, actor)
        return promotion
    version = promotion.version
    assert version is not None  # a move request always names its version (a database constraint)
    version = ModelVersion.objects.select_for_update(of=("self",)).select_related("model").get(pk=version.pk)
    if refusal := version.lifecycle_refusal("promoted"):
        raise Conflict(refusal)
    if version.status != VersionStatus.READY:
        raise Conflict(f"version {version.version} is no longer ready ({version.status}); it cannot be promoted")
    if alias.version_id != promotion.base_version_id:
        was = promotion.base_version.version if promotion.base_version else None
        now = alias.version.version if alias.version else None
        raise Conflict(
            f"alias '{alias.name}' moved from version {was} to {now} since the request was made; request again"
        )
    _check_at_approval(promotion, version, actor)
    if promotion.kind == PromotionKind.ROLLOUT:
        rollout = _pending_rollout(promotion)
        if rollout is None:
            raise Conflict(f"the rollout of promotion request {promotion.pk} is no longer pending")
        check_alias_signature(alias, version)
        _decide(promotion, PromotionState.APPROVED, actor, reason)
        rollout_begin(rollout, actor)  # the last step moves the alias, as this approved promotion
        return promotion
    _decide(promotion, PromotionState.APPROVED, actor, reason)
    approval = AliasMoveKind.APPROVAL
    _move(alias=alias, to=version, actor=actor, kind=approval, reason=promotion.reason, promotion=promotion)
    return promotion


def _check_at_approval(promotion: PromotionRequest, version: ModelVersion, actor: Actor) -> None:
    """Evaluate the policy again, with the approval, and keep the result; a written policy's failing rules block
    unless the request was forced (the built-in policy's checks were made at request, as they always were)."""
    alias = promotion.alias
    check = policy_check(alias, version, requester=promotion.requested_by, approvals=[actor.user])
    if not check.policy.builtin and check.failing and not promotion.force:
        why = "; ".join(f"{r['name']}: {r['why']}" for r in check.results if r["name"] in check.failing)
        raise Conflict(
            f"version {version.version} fails the policy of '{alias.name}' (policy {check.policy.number}) "
            f"at approval: {why}; the requester may ask again with force and a reason",
            detail={"policy": check.policy.number, "failing": check.failing, "rules": check.results},
        )
    promotion.policy_results_at_approval = check.as_json()
    promotion.save(update_fields=["policy_results_at_approval"])


@transaction.atomic(durable=True)
def promotion_reject(*, promotion_id: int, actor: Actor, reason: str = "") -> PromotionRequest:
    promotion = _locked_promotion(promotion_id)
    _check_reviewer(promotion, actor, "reject")
    _decide(promotion, PromotionState.REJECTED, actor, reason)
    return promotion


@transaction.atomic(durable=True)
def promotion_cancel(*, promotion_id: int, actor: Actor, reason: str = "") -> PromotionRequest:
    """The requester (or an admin) withdraws a pending request."""
    promotion = _locked_promotion(promotion_id)
    own = actor.user is not None and promotion.requested_by_id == actor.user.pk
    if not own and not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied("only the requester or an admin can cancel a promotion request")
    if promotion.state != PromotionState.PENDING:
        raise Conflict(f"promotion request {promotion.pk} is already {promotion.state}")
    _decide(promotion, PromotionState.CANCELLED, actor, reason)
    return promotion


def promotions_expire() -> int:
    """Mark pending requests past their deadline as expired; returns how many."""
    expired = 0
    for promotion_id in PromotionRequest.objects.filter(
        state=PromotionState.PENDING, expires_at__lte=timezone.now()
    ).values_list("pk", flat=True):
        with transaction.atomic(durable=True):
            promotion = _locked_promotion(promotion_id)
            if promotion.state == PromotionState.PENDING:
                _decide(promotion, PromotionState.EXPIRED, SYSTEM, "expired")
                expired += 1
    return expired
