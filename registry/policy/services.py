"""Writing an alias's promotion policy, and asking what it says of a version. Each write owns its transaction.

A new policy is a new :class:`~registry.models.AliasPolicy` version (numbers count up per alias, and
none is ever changed). On an unprotected alias it is in force at once; on a protected one it waits
for a second person's approval as a promotion request of kind ``policy``
(``registry/promotions.py`` puts it in force on approval, and marks it rejected otherwise), since a
policy loosened alone would let its author promote alone what it used to refuse.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db import transaction
from django.db.models import Max

from registry.access.auth import has_role
from registry.audit.chain import Actor, audit_record
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.models import (
    Alias,
    AliasPolicy,
    ModelVersion,
    PolicyState,
    PromotionKind,
    PromotionRequest,
    RegisteredModel,
    Role,
    WebhookEvent,
)
from registry.policy.engine import PolicyError, compile_policy
from registry.policy.rules import Policy, PolicyCheck, policy_activate, policy_check, policy_in_force, rules_of
from registry.promotions import _locked_alias, _locked_model, emit_promotion, promotion_ttl

__all__ = ["PolicyView", "policy_evaluate", "policy_set", "policy_view"]


@dataclass(frozen=True)
class PolicyView:
    """An alias's policy as the API shows it: the one in force, and a change waiting for approval."""

    alias: Alias
    policy: Policy
    pending: AliasPolicy | None

    def as_json(self) -> dict[str, Any]:
        record = self.policy.record
        return {
            "model": self.alias.model.name,
            "alias": self.alias.name,
            "number": self.policy.number,
            "builtin": self.policy.builtin,
            "rules": self.policy.as_json(),
            "created_by": record.created_by.get_username() if record and record.created_by else None,
            "created_at": record.created_at.isoformat() if record else None,
            "reason": record.reason if record else "",
            "pending": None
            if self.pending is None
            else {"number": self.pending.number, "promotion": self.pending.promotion_id, "rules": self.pending.rules},
        }


@dataclass(frozen=True)
class PolicySetOutcome:
    view: PolicyView
    promotion: PromotionRequest | None = None  # the request a protected alias's change waits for


def _alias(model: RegisteredModel, alias_name: str) -> Alias:
    alias = Alias.objects.select_related("model", "version").filter(model=model, name=alias_name).first()
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{alias_name}'")
    return alias


def _pending(alias: Alias) -> AliasPolicy | None:
    return alias.policies.filter(state=PolicyState.PENDING).first()


def policy_view(*, model: RegisteredModel, alias_name: str) -> PolicyView:
    alias = _alias(model, alias_name)
    return PolicyView(alias, policy_in_force(alias), _pending(alias))


@transaction.atomic(durable=True)
def policy_set(
    *, model: RegisteredModel, alias_name: str, rules: list[dict[str, Any]], actor: Actor, reason: str = ""
) -> PolicySetOutcome:
    """Write a new version of the alias's policy (made if the alias is new); a protected alias's waits for approval.

    Raises :class:`~registry.policy.engine.PolicyError` for a rule that does not compile or names an
    unknown variable, with its position.
    """
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied("changing an alias's promotion policy needs the maintainer role")
    parsed = rules_of(rules)
    try:
        compile_policy(parsed)
    except PolicyError as exc:
        raise InvalidInput(str(exc), detail=exc.detail) from None
    locked = _locked_model(model)
    alias = _locked_alias(locked, alias_name, create=True)
    assert alias is not None
    alias.model = locked
    if alias.protected:
        waiting = _pending(alias)
        if waiting is not None:
            raise Conflict(
                f"policy {waiting.number} of '{alias.name}' is waiting for approval in promotion request "
                f"{waiting.promotion_id}; cancel it first",
                detail={"promotion": waiting.promotion_id},
            )
    number = (alias.policies.aggregate(last=Max("number"))["last"] or 0) + 1
    record = AliasPolicy.objects.create(
        alias=alias,
        number=number,
        rules=[asdict(rule) for rule in parsed],
        state=PolicyState.PENDING,
        reason=reason,
        created_by=actor.user,
    )
    if not alias.protected:
        policy_activate(record, actor)
        return PolicySetOutcome(PolicyView(alias, policy_in_force(alias), None))
    promotion = PromotionRequest.objects.create(
        alias=alias,
        kind=PromotionKind.POLICY,
        base_version=alias.version,
        reason=reason,
        requested_by=actor.user,
        expires_at=promotion_ttl(),
    )
    record.promotion = promotion
    record.save(update_fields=["promotion"])
    current = policy_in_force(alias)
    audit_record(
        actor=actor,
        action="promotion.request",
        target_type="promotion",
        target=str(promotion.pk),
        model_name=alias.model.name,
        before={"policy": current.number, "builtin": current.builtin, "rules": current.as_json()},
        after={
            "alias": alias.name,
            "kind": PromotionKind.POLICY,
            "policy": number,
            "rules": record.rules,
            "reason": reason,
        },
    )
    emit_promotion(
        WebhookEvent.PROMOTION_REQUESTED,
        promotion,
        reason=reason,
        forced=False,
        policy=number,
        base_version=alias.version.version if alias.version else None,
        expires_at=promotion.expires_at.isoformat(),
    )
    return PolicySetOutcome(PolicyView(alias, current, record), promotion)


def policy_evaluate(*, model: RegisteredModel, alias_name: str, version_number: int, actor: Actor) -> PolicyCheck:
    """What the alias's policy says of promoting version ``version_number`` there now, asked by ``actor``; no change."""
    alias = _alias(model, alias_name)
    version = ModelVersion.objects.filter(model=model, version=version_number).first()
    if version is None:
        raise NotFound(f"model '{model.name}' has no version {version_number}")
    return policy_check(alias, version, requester=actor.user)


def pending_policy_of(promotion: PromotionRequest) -> AliasPolicy | None:
    """The policy a ``policy`` request asks for (whatever became of it)."""
    if promotion.kind != PromotionKind.POLICY:
        return None
    return promotion.policies.order_by("-number").first()
