"""An alias's promotion policy as it stands, the evidence its rules see, and what they say of a version.

The policy in force is the alias's active :class:`~registry.models.AliasPolicy`, or, for an alias that
never had one written, the **built-in policy** made from its settings (:func:`builtin_rules`): the
signature check every alias has always had, and a rule for each of ``max_slowdown_percent``,
``min_cosine`` and ``max_abs_diff`` that is set. A built-in policy is enforced by the checks that
have always enforced those settings (``registry/promotions.py``: the same refusals, word for word),
and its rules are evaluated alongside, so that the request records them rule by rule like any other.

The evidence (:func:`policy_evidence`) is read from what the registry stores: the two versions'
rows, the signature diff, the signatures recorded for the candidate, the benchmarks and accuracy
delta of ``registry/comparison.py``, the alias's shadow report, who asks and who approved. Nothing
is measured or downloaded to evaluate a rule.

Rules that refer to ``approvals`` are decided at approval: when a request is made nobody has
approved it yet, so there they are *waiting*, and block nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxkit.signatures import signature_compare, signature_diff
from registry.access.auth import user_roles
from registry.audit.chain import Actor, audit_record
from registry.comparison import Comparison, compare
from registry.models import Alias, AliasPolicy, ModelVersion, PolicyState, SignatureKind
from registry.policy.engine import CompiledRule, Rule, RuleResult, compile_policy, evaluate_policy
from registry.shadow.services import shadow_report_for

__all__ = [
    "Policy",
    "PolicyCheck",
    "builtin_rules",
    "policy_activate",
    "policy_check",
    "policy_evidence",
    "policy_in_force",
    "rules_of",
]

WAITING = "decided at approval"


@dataclass(frozen=True)
class Policy:
    """The policy an alias has: its rules, its number (0 for the built-in one) and the row, if any."""

    number: int
    rules: list[Rule]
    builtin: bool
    record: AliasPolicy | None = None

    def as_json(self) -> list[dict[str, Any]]:
        return [{"name": r.name, "expr": r.expr, "message": r.message, "builtin": self.builtin} for r in self.rules]


@dataclass(frozen=True)
class PolicyCheck:
    """What a policy says of one version now: each rule's result, and which rules fail."""

    policy: Policy
    results: list[dict[str, Any]]  # {"name", "passed", "why", "waiting"}
    comparison: Comparison  # the evidence's candidate-against-current, which the built-in policy's checks read too

    @property
    def failing(self) -> list[str]:
        return [r["name"] for r in self.results if not r["passed"] and not r["waiting"]]

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.results)

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy.number, "builtin": self.policy.builtin, "rules": self.results}


def rules_of(data: list[dict[str, Any]]) -> list[Rule]:
    return [Rule(name=r["name"], expr=r["expr"], message=r.get("message", "")) for r in data]


def _literal(value: float) -> str:
    """A CEL double literal for a setting (``10`` is written ``10.0``: the engine compares either way)."""
    text = repr(float(value))
    return text if any(c in text for c in ".en") else f"{text}.0"


def builtin_rules(alias: Alias) -> list[Rule]:
    """The rules an alias's settings amount to, as the built-in policy shows them."""
    rules = [
        Rule(
            "compatible-signature",
            "size(signature.breaking) == 0",
            "the candidate's inputs or outputs are not compatible with the current version's",
        )
    ]
    if alias.max_slowdown_percent is not None:
        limit = _literal(alias.max_slowdown_percent)
        rules.append(
            Rule(
                "max-slowdown",
                f"current == null || benchmark.slowdown_percent <= {limit}",
                f"more than {alias.max_slowdown_percent:g} % slower than the current version",
            )
        )
    if alias.min_cosine is not None:
        rules.append(
            Rule(
                "min-cosine",
                f"current == null || accuracy.cosine >= {_literal(alias.min_cosine)}",
                f"outputs' cosine similarity to the current version's below {alias.min_cosine:g}",
            )
        )
    if alias.max_abs_diff is not None:
        rules.append(
            Rule(
                "max-abs-diff",
                f"current == null || accuracy.max_abs_diff <= {_literal(alias.max_abs_diff)}",
                f"outputs differ from the current version's by more than {alias.max_abs_diff:g}",
            )
        )
    return rules


def policy_in_force(alias: Alias) -> Policy:
    """The alias's active policy, else its built-in one."""
    record = alias.policies.filter(state=PolicyState.ACTIVE).first() if alias.pk else None
    if record is None:
        return Policy(number=0, rules=builtin_rules(alias), builtin=True)
    return Policy(number=record.number, rules=rules_of(record.rules), builtin=False, record=record)


def _person(user: Any) -> dict[str, Any] | None:
    if user is None:
        return None
    return {"user": user.get_username(), "roles": sorted(user_roles(user))}


def _version(version: ModelVersion | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {
        "number": version.version,
        "status": version.status,
        "size_bytes": version.size_bytes,
        "metadata": version.metadata or {},
        "tags": list(version.tags or []),
        "uploaded_by": version.created_by.get_username() if version.created_by else None,
    }


def policy_evidence(
    alias: Alias,
    version: ModelVersion,
    *,
    requester: Any = None,
    approvals: list[Any] | None = None,
    comparison: Comparison | None = None,
) -> dict[str, Any]:
    """Every variable a rule may use, for promoting ``version`` to ``alias`` now (null where there is none).

    ``comparison`` is ``compare(version, alias.version, alias.name)`` when the caller has it already.
    """
    current = alias.version
    comparison = comparison or compare(version, current, alias.name)
    speed = comparison.speed
    signers = version.signatures.filter(kind=SignatureKind.UPLOADER).values_list("signer", flat=True)
    return {
        "candidate": _version(version),
        "current": _version(current),
        "signature": _signature(current, version),
        "provenance": {
            "signed": version.signatures.filter(kind=SignatureKind.REGISTRY).exists(),
            "signers": sorted(set(signers)),
        },
        "benchmark": None
        if speed is None
        else {
            "provider": speed.provider,
            "batch": speed.batch,
            "candidate": speed.candidate,
            "current": speed.current,
            "throughput_ratio": speed.throughput_ratio,
            "slowdown_percent": speed.slowdown_percent,
            "p99_change": speed.p99_change,
        },
        "accuracy": dict(comparison.accuracy) if comparison.accuracy is not None else None,
        "shadow": _shadow(alias, version),
        "approvals": [_person(user) for user in approvals or []],
        "requester": _person(requester),
    }


def _signature(current: ModelVersion | None, version: ModelVersion) -> dict[str, list[str]]:
    """The breaking differences from the current version's signature, and the others (one line each)."""
    if current is None:
        return {"breaking": [], "changes": []}
    rows = signature_compare(current.signature, version.signature)
    return {
        "breaking": signature_diff(current.signature, version.signature),
        "changes": [
            f"{row.kind} '{row.name}' {row.change}" for row in rows if row.change != "same" and not row.breaking
        ],
    }


def _shadow(alias: Alias, version: ModelVersion) -> dict[str, Any] | None:
    state = shadow_report_for(alias, version) if alias.pk else None
    return None if state is None else state.get("report")


def _compiled(policy: Policy) -> list[CompiledRule]:
    return compile_policy(policy.rules)


def policy_check(
    alias: Alias,
    version: ModelVersion,
    *,
    requester: Any = None,
    approvals: list[Any] | None = None,
    policy: Policy | None = None,
) -> PolicyCheck:
    """Evaluate the alias's policy (or ``policy``) on promoting ``version`` there now.

    Without ``approvals`` (a request being made), rules that refer to them are waiting, not failed.
    """
    policy = policy or policy_in_force(alias)
    compiled = _compiled(policy)
    comparison = compare(version, alias.version, alias.name)
    evidence = policy_evidence(alias, version, requester=requester, approvals=approvals, comparison=comparison)
    outcomes: list[RuleResult] = evaluate_policy(compiled, evidence)
    results = []
    for rule, outcome in zip(compiled, outcomes, strict=True):
        waiting = approvals is None and "approvals" in rule.variables and not outcome.passed
        results.append(
            {
                "name": outcome.name,
                "passed": outcome.passed,
                "why": WAITING if waiting else outcome.why,
                "waiting": waiting,
            }
        )
    return PolicyCheck(policy=policy, results=results, comparison=comparison)


def policy_activate(record: AliasPolicy, actor: Actor) -> None:
    """Put a policy version in force (caller's transaction, alias row locked): audited, the old one superseded."""
    alias = record.alias
    before = policy_in_force(alias)
    if before.record is not None:
        before.record.state = PolicyState.SUPERSEDED
        before.record.save(update_fields=["state"])
    record.state = PolicyState.ACTIVE
    record.save(update_fields=["state"])
    audit_record(
        actor=actor,
        action="alias.policy_set",
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before={"policy": before.number, "builtin": before.builtin, "rules": before.as_json()},
        after={
            "policy": record.number,
            "rules": record.rules,
            "reason": record.reason,
            "promotion": record.promotion_id,
        },
    )
