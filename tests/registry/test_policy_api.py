"""Promotion policies over the REST API: the built-in policy, writing versions (four eyes on a protected alias),
refusals with positions, enforcement at request and approval, forcing, and the evaluate endpoint.

The rule engine's own cases are in ``test_policy_engine.py``; the documented cookbook in
``test_policy_cookbook.py``; the evidence rules see, read from a real derivation's accuracy, recorded
benchmarks and a shadow's report, in ``test_policy_evidence.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from registry.models import AliasPolicy, AuditEvent, ModelVersion, PolicyState, PromotionRequest, Role
from tests.support.people import Person, make_person
from tests.support.registry import promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db

POLICY = "/api/v1/models/demo/aliases/{alias}/policy"
TAGGED = {"name": "tagged", "expr": '"validated" in candidate.tags', "message": "not validated"}
NOT_OWN = {"name": "not-own-upload", "expr": "requester.user != candidate.uploaded_by", "message": "own upload"}
SECOND = {
    "name": "second-approver",
    "expr": 'approvals.exists(a, "approver" in a.roles && a.user != requester.user)',
    "message": "needs an approver other than the requester",
}


@pytest.fixture(autouse=True)
def _unhurried(settings: Any) -> None:
    """Rules run under a deadline no busy CI machine reaches (the engine's tests test the deadline)."""
    settings.POLICY_EVAL_TIMEOUT_MS = 10_000


@pytest.fixture
def admin() -> Person:
    return make_person("root", Role.ADMIN)


@pytest.fixture
def versions(owner: Person, registered: str) -> list[ModelVersion]:
    """demo v1, v2, v3 (``y = x + 1``, ``+ 2``, ``+ 3``), ready; production (protected) serves v1."""
    return upload_versions(owner, [1.0, 2.0, 3.0])


@pytest.fixture
def production(owner: Person, approver: Person, versions: list[ModelVersion]) -> list[ModelVersion]:
    promote(owner, approver, 1)
    return versions


def put_policy(person: Person, alias: str, *rules: dict[str, str], reason: str = "") -> Any:
    return person.put(POLICY.format(alias=alias), {"rules": list(rules), "reason": reason})


def get_policy(person: Person, alias: str) -> dict[str, Any]:
    response = person.get(POLICY.format(alias=alias))
    assert response.status_code == 200, response.content
    return response.json()


def evaluate(person: Person, alias: str, version: int) -> Any:
    return person.post(POLICY.format(alias=alias) + "/evaluate", {"version": version})


def audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


# --- the built-in policy --------------------------------------------------------------------------------------


def test_an_alias_without_a_policy_shows_the_rules_its_settings_amount_to(owner, admin, production):
    assert admin.patch("/api/v1/models/demo/aliases/production", {"max_slowdown_percent": 10}).status_code == 200
    assert admin.patch("/api/v1/models/demo/aliases/production", {"min_cosine": 0.999}).status_code == 200

    body = get_policy(owner, "production")

    assert (body["number"], body["builtin"], body["pending"], body["created_by"]) == (0, True, None, None)
    assert [(r["name"], r["expr"], r["builtin"]) for r in body["rules"]] == [
        ("compatible-signature", "size(signature.breaking) == 0", True),
        ("max-slowdown", "current == null || benchmark.slowdown_percent <= 10.0", True),
        ("min-cosine", "current == null || accuracy.cosine >= 0.999", True),
    ]


def test_the_builtin_policy_records_what_the_old_checks_decide(owner, admin, production):
    """No benchmark of v2 yet: the slowdown limit refuses it with today's words, and its rule says why."""
    assert admin.patch("/api/v1/models/demo/aliases/production", {"max_slowdown_percent": 10}).status_code == 200

    refused = set_alias(owner, "production", 2)

    assert refused.status_code == 409
    assert refused.json()["error"].startswith("version 2 breaks the policy of 'production' against version 1: ")
    check = evaluate(owner, "production", 2).json()
    assert [(r["name"], r["passed"], r["why"]) for r in check["rules"]] == [
        ("compatible-signature", True, ""),
        ("max-slowdown", False, "no benchmark yet"),
    ]
    forced = owner.put("/api/v1/models/demo/aliases/production", {"version": 2, "force": True, "reason": "hotfix"})
    assert forced.status_code == 202
    promotion = PromotionRequest.objects.get(pk=forced.json()["id"])
    assert promotion.policy_results == {"policy": 0, "builtin": True, "rules": check["rules"]}
    assert audit("promotion.request")[-1].after["failing_rules"] == ["max-slowdown"]


# --- writing a policy -----------------------------------------------------------------------------------------


def test_a_policy_written_on_an_unprotected_alias_is_in_force_at_once_and_audited(owner, versions):
    assert set_alias(owner, "staging", 1).status_code == 200

    first = put_policy(owner, "staging", TAGGED, reason="release checklist")
    second = put_policy(owner, "staging", TAGGED, NOT_OWN)

    assert first.status_code == 201 and first.json()["number"] == 1
    assert second.status_code == 201
    body = get_policy(owner, "staging")
    assert (body["number"], body["builtin"], body["created_by"], body["pending"]) == (2, False, "owner", None)
    assert [r["name"] for r in body["rules"]] == ["tagged", "not-own-upload"]
    states = dict(AliasPolicy.objects.values_list("number", "state"))
    assert states == {1: PolicyState.SUPERSEDED, 2: PolicyState.ACTIVE}
    events = audit("alias.policy_set")
    assert [e.after["policy"] for e in events] == [1, 2]
    assert events[0].before["builtin"] is True and events[0].after["reason"] == "release checklist"
    assert [r["name"] for r in events[1].before["rules"]] == ["tagged"]
    assert [r["name"] for r in events[1].after["rules"]] == ["tagged", "not-own-upload"]


def test_a_rule_that_does_not_compile_is_refused_with_its_position(owner, versions):
    bad = {"name": "fast-enough", "expr": "benchmark.slowdown_percent <=\n  10 &&", "message": ""}

    response = put_policy(owner, "staging", TAGGED, bad)

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert (detail["rule"], detail["line"]) == ("fast-enough", 2)
    assert detail["column"] is not None
    assert "fast-enough" in response.json()["error"]
    assert not AliasPolicy.objects.exists()


def test_a_rule_naming_an_unknown_variable_is_refused_where_it_names_it(owner, versions):
    response = put_policy(owner, "staging", {"name": "typo", "expr": "size(signature.breaking) == 0 && banchmark.x"})

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert (detail["rule"], detail["line"], detail["column"]) == ("typo", 1, 34)
    assert "banchmark" in response.json()["error"]


def test_writing_needs_the_maintainer_role(outsider, approver, versions):
    for person in (outsider, approver):
        response = put_policy(person, "staging", TAGGED)
        assert response.status_code == 403
        assert response.json()["error"] == "this action needs the maintainer or admin role"


def test_on_a_protected_alias_a_policy_change_waits_for_a_second_person(owner, approver, production):
    asked = put_policy(owner, "production", TAGGED, reason="tighten")

    assert asked.status_code == 202
    promotion_id = asked.json()["promotion"]
    body = get_policy(owner, "production")
    assert (body["number"], body["builtin"]) == (0, True)  # not in force yet
    assert body["pending"] == {"number": 1, "promotion": promotion_id, "rules": [TAGGED]}
    again = put_policy(owner, "production", NOT_OWN)
    assert again.status_code == 409 and again.json()["detail"] == {"promotion": promotion_id}
    own = owner.post(f"/api/v1/promotions/{promotion_id}/approve", {})
    assert own.status_code == 403
    assert own.json()["error"] == "to approve a policy change you need the approver role"
    request = approver.get(f"/api/v1/promotions/{promotion_id}").json()
    assert (request["kind"], request["version"], request["state"]) == ("policy", None, "pending")

    approved = approver.post(f"/api/v1/promotions/{promotion_id}/approve", {"reason": "agreed"})

    assert approved.status_code == 200
    body = get_policy(owner, "production")
    assert (body["number"], body["builtin"], body["pending"]) == (1, False, None)
    [event] = audit("alias.policy_set")
    assert event.actor == "approver" and event.after["promotion"] == promotion_id


@pytest.mark.parametrize("decision", ["reject", "cancel"])
def test_a_refused_or_withdrawn_policy_change_never_comes_in_force(owner, approver, production, decision):
    promotion_id = put_policy(owner, "production", TAGGED).json()["promotion"]
    decider = approver if decision == "reject" else owner

    assert decider.post(f"/api/v1/promotions/{promotion_id}/{decision}", {}).status_code == 200

    assert AliasPolicy.objects.get().state == PolicyState.REJECTED
    body = get_policy(owner, "production")
    assert (body["number"], body["pending"]) == (0, None)
    assert put_policy(owner, "production", NOT_OWN).status_code == 202  # nothing waits any more


# --- enforcement ----------------------------------------------------------------------------------------------


def test_a_failing_rule_blocks_a_move_and_a_forced_one_names_it_in_the_audit(owner, versions):
    assert set_alias(owner, "staging", 1).status_code == 200
    assert put_policy(owner, "staging", TAGGED).status_code == 201

    refused = set_alias(owner, "staging", 2)

    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "version 2 fails the policy of 'staging' (policy 1): tagged: not validated. "
        "Send force=true with a reason to set it anyway."
    )
    assert refused.json()["detail"]["failing"] == ["tagged"]
    no_reason = owner.put("/api/v1/models/demo/aliases/staging", {"version": 2, "force": True})
    assert no_reason.status_code == 400
    forced = owner.put("/api/v1/models/demo/aliases/staging", {"version": 2, "force": True, "reason": "demo day"})
    assert forced.status_code == 200
    event = audit("alias.set")[-1]
    assert (event.after["version"], event.after["forced"], event.after["failing_rules"]) == (2, True, ["tagged"])
    ModelVersion.objects.filter(version=3).update(tags=["validated"])
    assert set_alias(owner, "staging", 3).status_code == 200  # passes: no force, nothing failing recorded
    assert "failing_rules" not in audit("alias.set")[-1].after


def test_evaluate_matches_what_the_request_records_and_approval_decides_the_approval_rule(
    owner, approver, production, admin
):
    # An approver-only rule: waiting when asked for, decided when approved.
    promotion_id = put_policy(owner, "production", NOT_OWN, SECOND).json()["promotion"]
    assert approver.post(f"/api/v1/promotions/{promotion_id}/approve", {}).status_code == 200
    uploader = make_person("uma", Role.MAINTAINER)
    ModelVersion.objects.filter(version=2).update(created_by=uploader.actor.user)

    check = evaluate(owner, "production", 2)

    assert check.status_code == 200
    assert check.json() == {
        "version": 2,
        "policy": 1,
        "builtin": False,
        "passed": False,
        "rules": [
            {"name": "not-own-upload", "passed": True, "why": "", "waiting": False},
            {"name": "second-approver", "passed": False, "why": "decided at approval", "waiting": True},
        ],
    }
    asked = set_alias(owner, "production", 2)
    assert asked.status_code == 202  # a waiting rule blocks nothing
    promotion = PromotionRequest.objects.get(pk=asked.json()["id"])
    assert promotion.policy_results == {"policy": 1, "builtin": False, "rules": check.json()["rules"]}
    assert approver.post(f"/api/v1/promotions/{promotion.pk}/approve", {}).status_code == 200
    promotion.refresh_from_db()
    assert [r["passed"] for r in promotion.policy_results_at_approval["rules"]] == [True, True]
    body = owner.get(f"/api/v1/promotions/{promotion.pk}").json()
    assert body["policy_results"] == promotion.policy_results
    assert body["policy_results_at_approval"] == promotion.policy_results_at_approval


def test_a_rule_failing_at_approval_blocks_an_unforced_request(owner, approver, production):
    promotion_id = put_policy(owner, "production", SECOND).json()["promotion"]
    assert approver.post(f"/api/v1/promotions/{promotion_id}/approve", {}).status_code == 200
    asked = set_alias(owner, "production", 2)
    assert asked.status_code == 202
    promotion_id = asked.json()["id"]
    # An admin may approve, but the rule asks for someone holding the approver role itself.
    root = make_person("root2", Role.ADMIN)

    refused = root.post(f"/api/v1/promotions/{promotion_id}/approve", {})

    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "version 2 fails the policy of 'production' (policy 1) at approval: second-approver: "
        "needs an approver other than the requester; the requester may ask again with force and a reason"
    )
    assert PromotionRequest.objects.get(pk=promotion_id).state == "pending"


def test_evaluate_refuses_what_does_not_exist(owner, versions):
    assert set_alias(owner, "staging", 1).status_code == 200
    assert evaluate(owner, "staging", 9).status_code == 404
    assert evaluate(owner, "nowhere", 1).status_code == 404
    assert evaluate(owner, "staging", 0).status_code == 400


def test_a_policy_past_its_limits_is_refused_naming_the_setting(owner, versions, settings):
    settings.POLICY_MAX_RULES = 1
    settings.POLICY_MAX_RULE_LENGTH = 20

    too_many = put_policy(owner, "staging", TAGGED, NOT_OWN)
    too_long = put_policy(owner, "staging", {"name": "long", "expr": "size(signature.breaking) == 0"})

    assert too_many.status_code == 400 and "MODELYARD_POLICY_MAX_RULES" in too_many.json()["error"]
    assert too_long.status_code == 400 and too_long.json()["detail"]["rule"] == "long"
    assert "at most 20" in too_long.json()["error"]
    assert not AliasPolicy.objects.exists()


def test_a_rollout_request_records_the_policy_as_a_move_request_does(owner, admin, production):
    assert admin.patch("/api/v1/models/demo/aliases/production", {"served": True}).status_code == 200

    asked = owner.put("/api/v1/models/demo/aliases/production/rollout", {"version": 2})

    assert asked.status_code == 202, asked.content
    promotion = PromotionRequest.objects.get(pk=asked.json()["promotion"])
    assert promotion.policy_results == {
        "policy": 0,
        "builtin": True,
        "rules": [{"name": "compatible-signature", "passed": True, "why": "", "waiting": False}],
    }
