"""Promotion policies in the web UI: the checklist, rule by rule, on the request page (what the policy says
now) and on a request's review page (as recorded when it was made and when it was approved), and a policy
change's review page with the rules it proposes beside those in force."""

from __future__ import annotations

from typing import Any

import pytest

from registry.models import AliasPolicy, PolicyState, PromotionKind, PromotionRequest
from tests.support.people import Person
from tests.support.registry import create_model, promote, set_alias, upload_versions

pytestmark = pytest.mark.django_db

POLICY = "/api/v1/models/demo/aliases/{alias}/policy"
TAGGED = {"name": "tagged", "expr": '"validated" in candidate.tags', "message": "not validated"}
SECOND = {
    "name": "second-approver",
    "expr": 'approvals.exists(a, "approver" in a.roles && a.user != requester.user)',
    "message": "needs an approver other than the requester",
}
BUILTIN = "built-in policy (from the alias's settings)"


def row(name: str, result: str, why: str = "") -> str:
    """A rule's row of the checklist, exactly as the page writes it."""
    mark, badge = {
        "passed": ("passed", "ok"),
        "failed": ("failed", "bad"),
        "waiting": ("waiting for approval", "warn"),
    }[result]
    cell = why or '<span class="muted">—</span>'
    return (
        f'<tr data-rule="{name}" data-result="{result}"><td class="nowrap"><span class="badge {badge}">{mark}</span>'
        f'</td><td><code>{name}</code></td><td class="wrap">{cell}</td></tr>'
    )


def section(html: str, anchor: str) -> str:
    """The part of the page from the heading with id ``anchor`` to the end of the table after it."""
    start = html.index(f'id="{anchor}"')
    return html[start : html.index("</table>", start)]


@pytest.fixture(autouse=True)
def _unhurried(settings: Any) -> None:
    """Rules run under a deadline no busy CI machine reaches (the engine's tests test the deadline)."""
    settings.POLICY_EVAL_TIMEOUT_MS = 10_000


@pytest.fixture
def serving_v1(mia: Person, ana: Person) -> None:
    """production (protected) serves v1; v2 is ready and compatible."""
    create_model(mia)
    upload_versions(mia, [1.0, 2.0])
    promote(mia, ana, 1)


def put_policy(person: Person, alias: str, *rules: dict[str, str]) -> Any:
    return person.put(POLICY.format(alias=alias), {"rules": list(rules), "reason": "tighten"})


def write_policy(mia: Person, ana: Person, *rules: dict[str, str]) -> None:
    """Put a policy in force on production: protected, so one person asks and another approves."""
    asked = put_policy(mia, "production", *rules)
    assert asked.status_code == 202, asked.content
    approved = ana.post(f"/api/v1/promotions/{asked.json()['promotion']}/approve", {"reason": "agreed"})
    assert approved.status_code == 200, approved.content


def review(person: Person, promotion_id: int) -> str:
    response = person.client.get(f"/ui/promotions/{promotion_id}")
    assert response.status_code == 200
    return str(response.content.decode())


# --- The review page ----------------------------------------------------------------------------------


def test_a_forced_request_shows_the_rule_that_failed_and_why(mia, ana, serving_v1):
    write_policy(mia, ana, TAGGED)
    refused = set_alias(mia, "production", 2)
    assert refused.status_code == 409
    forced = mia.put("/api/v1/models/demo/aliases/production", {"version": 2, "force": True, "reason": "x"})
    assert forced.status_code == 202, forced.content

    html = review(ana, forced.json()["id"])

    checklist = section(html, "policy-at-request")
    assert checklist.startswith('id="policy-at-request">Promotion policy when requested</h2>')
    assert (
        '<p class="small" id="policy-at-request-which" data-policy="1">policy 1: as checked when the request was '
        "made; the requester forced it, with the reason above</p>"
    ) in checklist
    assert row("tagged", "failed", "not validated") in checklist
    assert '<span class="badge breaking">forced past failing policy rules</span>' in html
    assert 'id="policy-at-approval"' not in html  # not approved yet


def test_an_approval_rule_waits_at_request_and_passes_at_approval(mia, ana, serving_v1):
    write_policy(mia, ana, SECOND)
    asked = set_alias(mia, "production", 2)
    assert asked.status_code == 202, asked.content
    promotion_id = asked.json()["id"]

    pending = review(ana, promotion_id)

    assert row("second-approver", "waiting", "decided at approval") in section(pending, "policy-at-request")
    assert 'id="policy-at-approval"' not in pending
    assert ana.post(f"/api/v1/promotions/{promotion_id}/approve", {"reason": "ok"}).status_code == 200

    approved = review(ana, promotion_id)

    assert row("second-approver", "waiting", "decided at approval") in section(approved, "policy-at-request")
    at_approval = section(approved, "policy-at-approval")
    assert at_approval.startswith('id="policy-at-approval">Promotion policy at approval</h2>')
    assert 'data-policy="1">policy 1: as checked again when it was approved, with the approval</p>' in at_approval
    assert row("second-approver", "passed") in at_approval


def test_a_request_made_before_policies_existed_says_it_was_not_checked(mia, ana, serving_v1):
    asked = set_alias(mia, "production", 2)
    assert asked.status_code == 202, asked.content
    PromotionRequest.objects.filter(pk=asked.json()["id"]).update(policy_results=None)

    html = review(ana, asked.json()["id"])

    assert (
        '<p class="muted" id="policy-at-request-unchecked">Not checked: this request was made before promotion '
        "policies existed.</p>"
    ) in html
    assert 'id="policy-at-request-rules"' not in html


def test_the_builtin_policy_is_named_as_such_on_the_review_page(mia, ana, serving_v1):
    asked = set_alias(mia, "production", 2)

    html = review(ana, asked.json()["id"])

    checklist = section(html, "policy-at-request")
    assert f'data-policy="0">{BUILTIN}: as checked when the request was made</p>' in checklist
    assert row("compatible-signature", "passed") in checklist


def test_a_policy_change_shows_the_proposed_rules_beside_those_in_force(mia, ana, serving_v1):
    asked = put_policy(mia, "production", TAGGED)
    assert asked.status_code == 202, asked.content
    promotion_id = asked.json()["promotion"]
    promotion = PromotionRequest.objects.get(pk=promotion_id)
    assert (promotion.kind, promotion.version) == (PromotionKind.POLICY, None)

    html = review(ana, promotion_id)

    assert f"<h1>Request {promotion_id}:\n  change the promotion policy of 'production' of demo\n" in html
    assert 'id="policy-at-request"' not in html and "Who signed" not in html  # no version to show
    proposed = section(html, "policy-proposed")
    assert "<h3>Proposed: policy 1</h3>" in proposed
    assert (
        '<tr data-rule="tagged"><td><code>tagged</code></td><td class="mono wrap">&quot;validated&quot; in '
        'candidate.tags</td><td class="wrap">not validated</td><td><span class="badge added">added</span>'
        "</td></tr>"
    ) in proposed
    current = section(html, "policy-current")
    assert f"<h3>In force now: {BUILTIN}</h3>" in current
    assert (
        '<tr data-rule="compatible-signature"><td><code>compatible-signature</code></td><td class="mono wrap">'
        'size(signature.breaking) == 0</td><td class="wrap">the candidate&#x27;s inputs or outputs are not '
        'compatible with the current version&#x27;s</td><td><span class="badge removed">removed</span></td></tr>'
    ) in current
    assert 'id="policy-state">pending</span>' in html
    assert "Put policy 1 in force on 'production' of demo?" in html  # the approve button's confirmation
    listing = ana.client.get("/ui/promotions").content.decode()
    assert f'<tr data-promotion="{promotion_id}">' in listing and "<td>policy change</td>" in listing

    assert ana.post(f"/api/v1/promotions/{promotion_id}/approve", {"reason": "agreed"}).status_code == 200
    approved = review(ana, promotion_id)

    assert AliasPolicy.objects.get(promotion_id=promotion_id).state == PolicyState.ACTIVE
    assert 'id="policy-state">in force</span>' in approved
    assert "<h3>In force now: policy 1</h3>" in approved
    assert '<p id="policy-current-is-proposed">Policy 1, proposed here, is the one in force now.</p>' in approved


def test_a_changed_rule_is_marked_against_the_one_in_force(mia, ana, serving_v1):
    write_policy(mia, ana, TAGGED)
    looser = {**TAGGED, "expr": '"validated" in candidate.tags || "hotfix" in candidate.tags'}
    asked = put_policy(mia, "production", looser, SECOND)
    assert asked.status_code == 202, asked.content

    html = review(ana, asked.json()["promotion"])

    proposed, current = section(html, "policy-proposed"), section(html, "policy-current")
    assert '<tr data-rule="tagged">' in proposed and '<span class="badge changed">changed</span>' in proposed
    assert '<tr data-rule="second-approver">' in proposed and '<span class="badge added">added</span>' in proposed
    assert "<h3>In force now: policy 1</h3>" in current
    assert '<span class="badge changed">changed</span>' in current and "removed" not in current


# --- The request page ---------------------------------------------------------------------------------


def test_the_request_page_shows_a_failing_rule_before_asking(mia, serving_v1):
    assert set_alias(mia, "staging", 1).status_code == 200
    assert put_policy(mia, "staging", TAGGED).status_code == 201

    response = mia.client.get("/ui/models/demo/promote", {"alias": "staging", "version": 2})

    assert response.status_code == 200
    html = response.content.decode()
    checklist = section(html, "policy")
    assert checklist.startswith('id="policy">Promotion policy</h2>')
    assert '<p class="small" id="policy-which" data-policy="1">policy 1: what it says of v2 now</p>' in checklist
    assert row("tagged", "failed", "not validated") in checklist
    assert (
        '<p class="flash warn wrap" id="policy-failing">v2 fails 1 rule of the policy of \'staging\' '
        "(tagged): moving it is refused unless you force it with a reason.</p>"
    ) in html
    # The force a failing rule needs is offered, and the reason it needs is required.
    assert "Force: I know this fails the policy of 'staging' (tagged)" in html
    assert '<textarea id="id_reason" name="reason" maxlength="2000" required>' in html

    forced = mia.client.post(
        "/ui/models/demo/promote", {"alias": "staging", "version": "2", "reason": "x", "force": "on"}
    )
    assert (forced.status_code, forced["Location"]) == (302, "/ui/models/demo")


def test_the_request_page_on_a_protected_alias_says_the_approval_decides_a_waiting_rule(mia, ana, serving_v1):
    write_policy(mia, ana, SECOND)

    html = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": 2}).content.decode()

    checklist = section(html, "policy")
    assert (
        'data-policy="1">policy 1: what it says of v2 now; the request records it, and it is checked again at '
        "approval</p>"
    ) in checklist
    assert row("second-approver", "waiting", "decided at approval") in checklist
    assert 'id="policy-failing"' not in html and 'name="force"' not in html


def test_the_request_page_for_a_new_alias_shows_the_builtin_policy(mia, serving_v1):
    response = mia.client.get("/ui/models/demo/promote", {"alias": "canary", "version": 2})

    assert response.status_code == 200
    html = response.content.decode()
    assert "<strong>canary</strong> does not exist yet" in html
    checklist = section(html, "policy")
    assert f'data-policy="0">{BUILTIN}: what it says of v2 now</p>' in checklist
    assert row("compatible-signature", "passed") in checklist


def test_the_request_page_shows_no_checklist_when_there_is_nothing_to_do(mia, serving_v1):
    html = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": 1}).content.decode()

    assert "It already points to v1: nothing to do." in html
    assert 'id="policy"' not in html
