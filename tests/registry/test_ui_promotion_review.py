"""Requesting a promotion from the UI, and reviewing it with the diff: force and reason, your own request, cancel."""

from __future__ import annotations

import pytest

from registry.models import Alias, AuditEvent, PromotionRequest, Role
from tests.support.onnx_models import add_model_bytes
from tests.support.people import login_person
from tests.support.registry import create_model, promote, set_alias, set_served, upload_versions
from tests.support.uploads import upload_local

pytestmark = pytest.mark.django_db


@pytest.fixture
def mia():
    """Maintainer and approver: may request, may not approve her own request."""
    return login_person("mia", Role.MAINTAINER, Role.APPROVER)


@pytest.fixture
def ana():
    return login_person("ana", Role.APPROVER)


@pytest.fixture
def serving_v1(mia, ana):
    """production serves v1 (y = x + 1); v2 is compatible (bias 2); v3 has another width (breaking)."""
    create_model(mia)
    upload_versions(mia, [1.0, 2.0])
    upload_local("demo", [("model.onnx", add_model_bytes(width=5))], actor=mia.actor)
    promote(mia, ana, 1)


def test_request_page_shows_the_diff_against_the_alias_and_that_approval_is_needed(mia, serving_v1):
    response = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": 2})
    assert response.status_code == 200
    assert (response.context["current"].version, response.context["candidate"].version) == (1, 2)
    assert response.context["needs_approval"] is True
    assert response.context["diff"]["breaking"] == []
    assert b"needs approval" in response.content and b"No breaking change" in response.content
    # Without parameters: production and the latest ready version.
    default = mia.client.get("/ui/models/demo/promote")
    assert (default.context["alias_name"], default.context["candidate"].version) == ("production", 3)


def test_requesting_opens_a_promotion_and_leads_to_its_review(mia, serving_v1):
    response = mia.client.post(
        "/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "better recall"}
    )
    promotion = PromotionRequest.objects.get(state="pending")
    assert (response.status_code, response["Location"]) == (302, f"/ui/promotions/{promotion.pk}")
    assert (promotion.version.version, promotion.reason, promotion.force) == (2, "better recall", False)
    event = AuditEvent.objects.filter(action="promotion.request").latest("seq")
    assert (event.actor, event.target, event.after["version"]) == ("mia", str(promotion.pk), 2)
    review = mia.client.get(f"/ui/promotions/{promotion.pk}")
    assert (
        review.context["why_not"]
        == "You requested this promotion; another approver must approve it. You can cancel it."
    )
    assert b"Approve</button>" not in review.content
    assert b"Cancel request" in review.content


def test_an_unprotected_alias_moves_at_once(mia, serving_v1):
    response = mia.client.post("/ui/models/demo/promote", {"alias": "staging", "version": "2", "reason": "try it"})
    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo")
    assert Alias.objects.get(name="staging").version.version == 2
    assert not PromotionRequest.objects.filter(state="pending").exists()
    assert b"&#x27;staging&#x27; now points to version 2." in mia.client.get("/ui/models/demo").content


def test_a_breaking_version_needs_force_and_a_reason(mia, serving_v1):
    page = mia.client.get("/ui/models/demo/promote", {"alias": "production", "version": 3})
    assert page.context["diff"]["breaking"] == [
        "input 'x': dimension 1 changed from 4 to 5",
        "output 'y': dimension 1 changed from 4 to 5",
    ]
    assert b'name="force"' in page.content and b"required" in page.content

    without_force = mia.client.post("/ui/models/demo/promote", {"alias": "production", "version": "3", "reason": "x"})
    assert without_force.status_code == 409
    # The page has a Force checkbox: its refusal says to tick it, not what an API client sends.
    assert without_force.context["error"] == (
        "version 3 is not compatible with version 1 behind 'production': input 'x': dimension 1 changed from 4 to 5; "
        "output 'y': dimension 1 changed from 4 to 5. Tick Force and give a reason to set it anyway."
    )
    assert without_force.context["diff"]["breaking"]  # the diff stays on the page
    without_reason = mia.client.post("/ui/models/demo/promote", {"alias": "production", "version": "3", "force": "on"})
    assert (without_reason.status_code, without_reason.context["error"]) == (
        400,
        "Force needs a reason: write it in the Reason box.",
    )
    assert not PromotionRequest.objects.filter(state="pending").exists()

    forced = mia.client.post(
        "/ui/models/demo/promote", {"alias": "production", "version": "3", "force": "on", "reason": "new column"}
    )
    assert forced.status_code == 302
    promotion = PromotionRequest.objects.get(state="pending")
    assert (promotion.force, promotion.reason) == (True, "new column")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"alias": "production", "version": "two"}, "version: Enter a whole number."),
        (
            {"alias": "Prod!", "version": "2"},
            "alias: use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit",
        ),
        (
            {"alias": "production", "version": "2", "reason": "x" * 2001},
            "reason: Ensure this value has at most 2000 characters (it has 2001).",
        ),
    ],
)
def test_bad_request_forms_are_400(mia, serving_v1, data, error):
    response = mia.client.post("/ui/models/demo/promote", data)
    assert (response.status_code, response.context["error"]) == (400, error)
    assert not PromotionRequest.objects.filter(state="pending").exists()


def test_a_version_not_ready_is_409(mia, serving_v1):
    from registry.models import ModelVersion

    ModelVersion.objects.filter(version=2).update(status="failed")
    response = mia.client.post("/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "x"})
    assert (response.status_code, response.context["error"]) == (
        409,
        "version 2 is failed; only a ready version can be set on an alias",
    )


def test_viewer_request_is_refused_and_audited(serving_v1):
    viewer = login_person("vic", Role.VIEWER)
    page = viewer.client.get("/ui/models/demo/promote", {"version": 2})
    assert b"Requesting a promotion needs the maintainer role." in page.content
    assert b'id="request"' not in page.content
    response = viewer.client.post("/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "x"})
    assert (response.status_code, response.context["error"]) == (
        403,
        "requesting a promotion needs the maintainer role",
    )
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", "POST /ui/models/demo/promote")


def test_review_page_shows_both_versions_the_diff_and_marks_breaking_changes(mia, ana, serving_v1):
    set_alias_response = mia.client.post(
        "/ui/models/demo/promote", {"alias": "production", "version": "3", "force": "on", "reason": "new column"}
    )
    assert set_alias_response.status_code == 302
    promotion = PromotionRequest.objects.get(state="pending")
    review = ana.client.get(f"/ui/promotions/{promotion.pk}")
    assert review.status_code == 200
    assert review.context["why_not"] == ""
    assert (review.context["diff"]["old"].version, review.context["diff"]["new"].version) == (1, 3)
    html = review.content.decode()
    assert "forced past breaking changes" in html and "new column" in html
    assert "input &#x27;x&#x27;: dimension 1 changed from 4 to 5" in html
    assert html.count('<tr class="breaking">') == 2
    assert "Approve</button>" in html and "Reject</button>" in html
    assert "data-confirm=" in html and "It breaks clients" in html  # the confirmation says so too


def test_a_viewer_sees_why_not_and_no_buttons(mia, serving_v1):
    set_alias(mia, "production", 2)
    promotion = PromotionRequest.objects.get(state="pending")
    review = login_person("vic", Role.VIEWER).client.get(f"/ui/promotions/{promotion.pk}")
    assert review.context["why_not"] == "Approving and rejecting need the approver role."
    assert b"Approve</button>" not in review.content


def test_the_requester_cancels_and_another_cannot(mia, ana, serving_v1):
    set_alias(mia, "production", 2)
    promotion = PromotionRequest.objects.get(state="pending")
    refused = ana.client.post(f"/ui/promotions/{promotion.pk}/cancel", {"reason": "mine now"})
    assert (refused.status_code, refused.context["error"]) == (
        403,
        "only the requester or an admin can cancel a promotion request",
    )
    response = mia.client.post(f"/ui/promotions/{promotion.pk}/cancel", {"reason": "wrong version"})
    assert (response.status_code, response["Location"]) == (302, "/ui/promotions")
    promotion.refresh_from_db()
    assert (promotion.state, promotion.decision_reason) == ("cancelled", "wrong version")
    review = ana.client.get(f"/ui/promotions/{promotion.pk}")
    assert review.context["why_not"] == "This request is cancelled."


def test_the_api_keeps_its_own_wording_for_a_breaking_change(mia, serving_v1):
    refused = mia.client.put(
        "/api/v1/models/demo/aliases/production",
        {"version": 3, "reason": "x"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mia.token}",
    )
    assert refused.status_code == 409
    assert refused.json()["error"].endswith(
        "output 'y': dimension 1 changed from 4 to 5. Send force=true with a reason to set it anyway."
    )


def test_approving_an_aliases_first_version_names_no_version_it_moves_from(mia, ana):
    create_model(mia)
    upload_versions(mia, [1.0])
    set_alias(mia, "production", 1)
    promotion = PromotionRequest.objects.get(state="pending")
    assert promotion.base_version is None
    html = ana.client.get(f"/ui/promotions/{promotion.pk}").content.decode()
    assert (
        "data-confirm=\"Point 'production' of demo at v1? It pointed to no version when this was requested. "
        'Inference processes start serving it at once."'
    ) in html
    assert " from v" not in html


def test_the_review_shows_a_renamed_model_file_as_a_rename(mia, ana, serving_v1):
    model = add_model_bytes(bias=1.0)  # v1's model, under another name
    upload_local("demo", [("renamed.onnx", model)], actor=mia.actor)
    set_alias(mia, "production", 4)
    promotion = PromotionRequest.objects.get(state="pending")
    review = ana.client.get(f"/ui/promotions/{promotion.pk}")
    assert [(row.renamed_from, row.name, row.change) for row in review.context["diff"]["files"]] == [
        ("model.onnx", "renamed.onnx", "renamed")
    ]
    assert "model.onnx → renamed.onnx" in review.content.decode()


def test_approving_a_served_alias_says_inference_switches(mia, ana, serving_v1):
    set_served(login_person("root", Role.ADMIN), "production", True)
    set_alias(mia, "production", 2)
    promotion = PromotionRequest.objects.get(state="pending")
    html = ana.client.get(f"/ui/promotions/{promotion.pk}").content.decode()
    assert "from v1 to v2? Inference processes switch to it at once." in html
    assert ana.client.get("/ui/promotions/999").status_code == 404


def test_an_approver_the_requester_made_sees_why_they_cannot_decide_and_the_review_lists_the_grant(
    mia, ana, serving_v1
):
    ada = login_person("ada", Role.ADMIN)
    bob = login_person("bob", Role.MAINTAINER)
    granted = ada.client.post("/ui/users/bob", {"roles": ["maintainer", "approver"], "is_active": "on"})
    assert granted.status_code == 302
    grant = AuditEvent.objects.get(action="user.roles.grant", target="bob", actor="ada")
    assert (grant.actor, grant.after) == ("ada", {"roles": ["approver"], "privileged": ["approver"]})
    ada.client.post("/ui/models/demo/promote", {"alias": "production", "version": "2", "reason": "mine"})
    promotion = PromotionRequest.objects.get(state="pending")
    how = f"ada requested this promotion and granted you the approver role ({grant.at.isoformat(timespec='seconds')})"

    review = bob.client.get(f"/ui/promotions/{promotion.pk}")
    assert review.context["why_not"] == f"You cannot be the second person here: {how}. Another approver must decide it."
    assert b"Approve</button>" not in review.content
    listed = [(g.actor, g.target, g.after["privileged"]) for g in review.context["grants"]]
    assert listed[0] == ("ada", "bob", ["approver"])  # newest first; the fixtures' grants by system follow
    assert ("system", "ana", ["approver"]) in listed
    assert review.content.count(b'<span class="badge breaking">the requester</span>') == 1

    refused = bob.client.post(f"/ui/promotions/{promotion.pk}/approve", {"reason": ""})
    assert (refused.status_code, refused.context["error"]) == (403, f"{how}; another approver must approve it")
    assert AuditEvent.objects.filter(action="access.denied", actor="bob").count() == 1
    promotion.refresh_from_db()
    assert promotion.state == "pending"

    # ana's account is none of ada's doing: she decides.
    other = ana.client.get(f"/ui/promotions/{promotion.pk}")
    assert other.context["why_not"] == "" and b"Approve</button>" in other.content
    assert ana.client.post(f"/ui/promotions/{promotion.pk}/approve", {"reason": ""}).status_code == 302
    promotion.refresh_from_db()
    assert (promotion.state, promotion.decided_by.username) == ("approved", "ana")
