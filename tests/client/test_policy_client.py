"""Promotion policies through the Python client against a live server: read, write (four eyes on a protected
alias), refusals with positions, evaluation, and the results a promotion request carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from modelyard.client import (
    BadRequest,
    Client,
    Forbidden,
    NotFound,
    Policy,
    PolicyCheck,
    PolicyRule,
    Promotion,
    RuleResult,
)
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

SIGNATURE = {
    "name": "compatible-signature",
    "expr": "size(signature.breaking) == 0",
    "message": "the candidate's inputs or outputs are not compatible with the current version's",
}
TAGGED = {"name": "tagged", "expr": '"validated" in candidate.tags', "message": "not validated"}
SECOND = {
    "name": "second-approver",
    "expr": 'approvals.exists(a, "approver" in a.roles && a.user != requester.user)',
    "message": "needs an approver other than the requester",
}


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[Client, Client]:
    owner = Client(live.url, live.createtoken("polly", "maintainer"))
    approver = Client(live.url, live.createtoken("abe", "approver"))
    return owner, approver


def two_versions(owner: Client, approver: Client, name: str, folder: Path) -> Promotion:
    """``name`` v1 and v2 (same signature), v1 on ``staging`` (unprotected) and on ``production`` (protected)."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, bias in ((1, 1.0), (2, 2.0)):
        path = folder / f"v{number}.onnx"
        onnx.save(add_model(bias=bias), path)
        assert owner.wait_ready(name, owner.push(name, path).version).version == number
    assert owner.promote(name, "staging", 1) is not None
    request = owner.promote(name, "production", 1, reason="launch")
    assert isinstance(request, Promotion)
    return approver.approve(request.id, reason="ok")


def test_an_alias_without_a_policy_reads_as_its_builtin_one(live, people, tmp_path):
    owner, approver = people
    launched = two_versions(owner, approver, "plain", tmp_path)

    policy = owner.policy("plain", "staging")

    assert isinstance(policy, Policy)
    assert (policy.model, policy.alias, policy.number, policy.builtin) == ("plain", "staging", 0, True)
    assert (policy.created_by, policy.created_at, policy.reason, policy.pending, policy.promotion) == (
        None,
        None,
        "",
        None,
        None,
    )
    assert policy.rules == [
        PolicyRule(
            name="compatible-signature",
            expr="size(signature.breaking) == 0",
            message=SIGNATURE["message"],
            builtin=True,
            raw={**SIGNATURE, "builtin": True},
        )
    ]
    assert policy.pending_rules == []
    assert policy.raw["rules"] == [{**SIGNATURE, "builtin": True}] and policy.raw["number"] == 0
    assert approver.policy("plain", "staging").rules == policy.rules  # reading needs no role

    # Even a request made before any policy was written records the built-in one's results, rule by rule.
    assert launched.policy_results == {
        "policy": 0,
        "builtin": True,
        "rules": [{"name": "compatible-signature", "passed": True, "why": "", "waiting": False}],
    }
    assert launched.policy_results_at_approval == {
        "policy": 0,
        "builtin": True,
        "rules": [{"name": "compatible-signature", "passed": True, "why": "", "waiting": False}],
    }

    with pytest.raises(NotFound) as no_alias:
        owner.policy("plain", "canary")
    assert no_alias.value.error == "model 'plain' has no alias 'canary'"


def test_writing_a_policy_on_an_unprotected_alias_puts_it_in_force(live, people, tmp_path):
    owner, approver = people
    two_versions(owner, approver, "written", tmp_path)

    written = owner.policy_set("written", "staging", [TAGGED], reason="release checklist")

    assert (written.model, written.alias, written.number, written.builtin) == ("written", "staging", 1, False)
    assert (written.created_by, written.reason, written.pending, written.promotion) == (
        "polly",
        "release checklist",
        None,
        None,
    )
    assert written.created_at and written.created_at == written.raw["created_at"]
    assert [(r.name, r.expr, r.message, r.builtin) for r in written.rules] == [
        ("tagged", '"validated" in candidate.tags', "not validated", False)
    ]
    assert owner.policy("written", "staging") == written

    # Rules read back (PolicyRule, the built-in ones too) go back as they are, beside new ones.
    builtin = owner.policy("written", "production").rules
    again = owner.policy_set("written", "staging", [*builtin, *written.rules, SECOND])
    assert again.number == 2 and again.reason == ""
    assert [r.name for r in again.rules] == ["compatible-signature", "tagged", "second-approver"]
    assert not any(r.builtin for r in again.rules)

    # A message is optional.
    bare = owner.policy_set("written", "staging", [{"name": "bare", "expr": "true"}])
    assert [(r.name, r.message) for r in bare.rules] == [("bare", "")]


def test_refusals_carry_the_rule_and_its_position(live, people, tmp_path):
    owner, approver = people
    two_versions(owner, approver, "refused", tmp_path)

    with pytest.raises(BadRequest) as unknown:
        owner.policy_set("refused", "staging", [TAGGED, {"name": "typo", "expr": "size(signature.breaking) == 0 && x"}])
    assert unknown.value.status == 400
    assert unknown.value.detail == {
        "rule": "typo",
        "line": 1,
        "column": 34,
        "error": unknown.value.error,
    }
    assert unknown.value.error.startswith("rule 'typo', line 1, column 34: unknown variable 'x'")

    with pytest.raises(BadRequest) as twice:
        owner.policy_set("refused", "staging", [TAGGED, TAGGED])
    assert twice.value.detail == {
        "rule": "tagged",
        "line": None,
        "column": None,
        "error": "rule 'tagged': two rules have this name",
    }
    with pytest.raises(Forbidden) as role:
        approver.policy_set("refused", "staging", [TAGGED])
    assert role.value.error == "this action needs the maintainer or admin role"
    assert owner.policy("refused", "staging").number == 0  # none of them was written


def test_a_protected_alias_s_policy_waits_for_a_second_person(live, people, tmp_path):
    owner, approver = people
    two_versions(owner, approver, "guarded", tmp_path)

    asked = owner.policy_set("guarded", "production", [TAGGED], reason="tighten")

    assert isinstance(asked.promotion, int)
    # The policy in force is still the built-in one; the new one waits.
    assert (asked.number, asked.builtin, asked.raw["promotion"]) == (0, True, asked.promotion)
    assert asked.pending == {"number": 1, "promotion": asked.promotion, "rules": [TAGGED]}
    assert asked.pending_rules == [
        PolicyRule(name="tagged", expr='"validated" in candidate.tags', message="not validated", raw=TAGGED)
    ]
    shown = owner.policy("guarded", "production")
    assert (shown.number, shown.pending, shown.promotion) == (0, asked.pending, None)
    request = owner.get_promotion(asked.promotion)
    assert (request.kind, request.version, request.state, request.reason) == ("policy", None, "pending", "tighten")

    approver.approve(asked.promotion, reason="agreed")

    now = owner.policy("guarded", "production")
    assert (now.number, now.builtin, now.created_by, now.reason, now.pending) == (1, False, "polly", "tighten", None)
    assert [r.name for r in now.rules] == ["tagged"]


def test_evaluate_says_rule_by_rule_and_a_request_carries_the_results(live, people, tmp_path):
    owner, approver = people
    two_versions(owner, approver, "judged", tmp_path)
    asked = owner.policy_set("judged", "production", [TAGGED, SECOND])
    assert asked.promotion is not None
    approver.approve(asked.promotion)

    check = owner.policy_evaluate("judged", "production", 2)

    assert isinstance(check, PolicyCheck)
    assert (check.version, check.policy, check.builtin, check.passed) == (2, 1, False, False)
    assert check.rules == [
        RuleResult(name="tagged", passed=False, why="not validated", waiting=False, raw=check.raw["rules"][0]),
        RuleResult(
            name="second-approver", passed=False, why="decided at approval", waiting=True, raw=check.raw["rules"][1]
        ),
    ]
    assert [r.name for r in check.failing] == ["tagged"]
    assert [r.name for r in check.waiting] == ["second-approver"]

    owner.update_version("judged", 2, tags=["validated"])
    tagged = owner.policy_evaluate("judged", "production", 2)
    assert (tagged.passed, tagged.failing, [r.name for r in tagged.waiting]) == (False, [], ["second-approver"])

    # The request records what the requester saw; the approval, what the approver's approval decided.
    request = owner.promote("judged", "production", 2, reason="validated")
    assert isinstance(request, Promotion)
    results: dict[str, Any] = {"policy": 1, "builtin": False, "rules": tagged.raw["rules"]}
    assert (request.policy_results, request.policy_results_at_approval) == (results, None)
    approved = approver.approve(request.id, reason="ok")
    assert approved.policy_results == results
    assert approved.policy_results_at_approval == {
        "policy": 1,
        "builtin": False,
        "rules": [
            {"name": "tagged", "passed": True, "why": "", "waiting": False},
            {"name": "second-approver", "passed": True, "why": "", "waiting": False},
        ],
    }
    assert owner.get_promotion(request.id).policy_results_at_approval == approved.policy_results_at_approval

    with pytest.raises(NotFound) as no_version:
        owner.policy_evaluate("judged", "production", 9)
    assert no_version.value.error == "model 'judged' has no version 9"


def test_the_types_read_an_answer_as_typed_parts():
    policy = Policy.from_json(
        {
            "model": "resnet",
            "alias": "production",
            "number": 3,
            "builtin": False,
            "rules": [{**TAGGED, "builtin": False}],
            "created_by": "alice",
            "created_at": "2025-03-02T10:14:07Z",
            "reason": "add a check",
            "pending": {"number": 4, "promotion": 17, "rules": [SECOND]},
        }
    )
    assert policy.rules == [
        PolicyRule(
            name="tagged",
            expr='"validated" in candidate.tags',
            message="not validated",
            builtin=False,
            raw={**TAGGED, "builtin": False},
        )
    ]
    assert (policy.number, policy.created_by, policy.promotion) == (3, "alice", None)
    assert [(r.name, r.builtin) for r in policy.pending_rules] == [("second-approver", False)]
    assert policy.raw["rules"] == [{**TAGGED, "builtin": False}]  # raw stays the answer as it was

    check = PolicyCheck.from_json({"version": 7, "policy": 0, "builtin": True, "passed": True, "rules": []})
    assert (check.version, check.policy, check.builtin, check.passed, check.rules) == (7, 0, True, True, [])
    promotion = Promotion.from_json(
        {"id": 1, "kind": "move", "model": "m", "alias": "production", "version": 2, "state": "pending"}
    )
    assert (promotion.policy_results, promotion.policy_results_at_approval) == (None, None)
