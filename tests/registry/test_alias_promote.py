"""Aliases: setting, signature checks, four-eyes promotion, rollback and history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from registry.access import services
from registry.audit.chain import Actor
from registry.models import Alias, AliasMove, AuditEvent, ModelVersion, PromotionRequest, Role, VersionStatus
from tests.support.onnx_models import add_model_bytes, multi_io_model
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

ALIASES = "/api/v1/models/demo/aliases"


@pytest.fixture
def two_versions(owner, registered):
    for bias in (1.0, 2.0):
        assert owner.upload(registered, [("m.onnx", add_model_bytes(bias=bias))]).status_code == 201
    return registered


def put(person, alias, **body):
    return person.client.put(
        f"{ALIASES}/{alias}", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {person.token}"
    )


def actions() -> list[str]:
    return list(AuditEvent.objects.order_by("seq").values_list("action", flat=True))


def test_new_model_has_protected_served_production_alias(owner, registered):
    [alias] = owner.get(ALIASES).json()
    del alias["updated_at"]
    assert alias == {
        "alias": "production",
        "version": None,
        "protected": True,
        "served": True,
        "max_slowdown_percent": None,
        "min_cosine": None,
        "max_abs_diff": None,
        "require_signature": False,
        "trusted_signers": [],
        "cache": None,
    }


def test_set_unprotected_alias_moves_it_and_records_history(owner, two_versions):
    response = put(owner, "staging", version=1, reason="smoke")
    assert response.status_code == 200, response.content
    assert response.json()["version"] == 1
    assert (response.json()["protected"], response.json()["served"]) == (False, False)
    assert put(owner, "staging", version=2, reason="next").status_code == 200
    history = owner.get(f"{ALIASES}/staging/history").json()
    assert [(m["from_version"], m["to_version"], m["kind"], m["reason"], m["moved_by"]) for m in history] == [
        (None, 1, "set", "smoke", "owner"),
        (1, 2, "set", "next", "owner"),
    ]
    assert actions()[-2:] == ["alias.set", "alias.set"]


def test_only_ready_versions_can_be_set(owner, two_versions):
    ModelVersion.objects.filter(version=2).update(status=VersionStatus.FAILED)
    response = put(owner, "staging", version=2)
    assert response.status_code == 409
    assert response.json()["error"] == "version 2 is failed; only a ready version can be set on an alias"
    assert not Alias.objects.filter(name="staging").exists()


def test_unknown_version_is_404_and_bad_body_is_400(owner, two_versions):
    assert put(owner, "staging", version=9).status_code == 404
    response = put(owner, "staging", version="one")
    assert response.status_code == 400
    assert response.json()["error"] == "version: A valid integer is required."
    assert put(owner, "Bad Alias", version=1).status_code == 400


def test_viewer_cannot_set_alias(outsider, two_versions):
    assert put(outsider, "staging", version=1).status_code == 403
    assert not AliasMove.objects.exists()


def test_breaking_signature_is_refused_with_a_diff_unless_forced(owner, two_versions):
    assert put(owner, "staging", version=1).status_code == 200
    assert owner.upload(two_versions, [("m.onnx", multi_io_model().SerializeToString())]).status_code == 201
    response = put(owner, "staging", version=3)
    assert response.status_code == 409
    body = response.json()
    assert body["detail"]["breaking"] == [
        "input 'x' was removed",
        "input 'a' is new, and clients do not send it",
        "input 'b' is new, and clients do not send it",
        "output 'y' was removed",
    ]
    assert body["error"].startswith(
        "version 3 is not compatible with version 1 behind 'staging': input 'x' was removed"
    )
    assert Alias.objects.get(name="staging").version.version == 1

    no_reason = put(owner, "staging", version=3, force=True)
    assert no_reason.status_code == 400
    assert no_reason.json()["error"] == "force=true needs a reason"

    forced = put(owner, "staging", version=3, force=True, reason="new interface, clients updated")
    assert forced.status_code == 200
    move = AliasMove.objects.latest("id")
    assert (move.forced, move.reason) == (True, "new interface, clients updated")
    assert AuditEvent.objects.filter(action="alias.set").latest("seq").after["forced"] is True


def test_four_eyes_requester_cannot_approve_but_approver_can(owner, approver, two_versions):
    response = put(owner, "production", version=1, reason="launch")
    assert response.status_code == 202
    request = response.json()
    assert (request["model"], request["alias"], request["version"], request["state"], request["requested_by"]) == (
        "demo",
        "production",
        1,
        "pending",
        "owner",
    )
    assert Alias.objects.get(name="production").version is None

    pending = approver.get("/api/v1/promotions?state=pending").json()
    assert [p["id"] for p in pending["results"]] == [request["id"]]

    # The requester is refused even when they also hold the approver role.
    both = make_person("both", "maintainer", "approver")
    own = put(both, "production", version=2).json()
    refused = both.post(f"/api/v1/promotions/{own['id']}/approve", {})
    assert refused.status_code == 403
    assert refused.json()["error"] == "you requested this promotion; another approver must approve it"

    maintainer_only = owner.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert maintainer_only.status_code == 403
    assert maintainer_only.json()["error"] == "to approve a promotion you need the approver role"

    approved = approver.post(f"/api/v1/promotions/{request['id']}/approve", {"reason": "looks good"})
    assert approved.status_code == 200, approved.content
    assert approved.json()["state"] == "approved"
    assert approved.json()["decided_by"] == "approver"
    assert Alias.objects.get(name="production").version.version == 1
    move = AliasMove.objects.get(alias__name="production")
    assert (move.kind, move.promotion_id, move.moved_by.username) == ("approval", request["id"], "approver")
    assert "promotion.request" in actions()
    assert actions()[-2:] == ["promotion.approve", "alias.set"]


def test_rejection_leaves_alias_where_it_was(owner, approver, two_versions):
    request = put(owner, "production", version=1).json()
    response = approver.post(f"/api/v1/promotions/{request['id']}/reject", {"reason": "not yet"})
    assert response.status_code == 200
    assert response.json()["state"] == "rejected"
    assert Alias.objects.get(name="production").version is None
    assert actions()[-1] == "promotion.reject"
    again = approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert again.status_code == 409
    assert again.json()["error"] == f"promotion request {request['id']} is already rejected"


def test_approval_refused_when_version_no_longer_ready(owner, approver, two_versions):
    request = put(owner, "production", version=1).json()
    ModelVersion.objects.filter(version=1).update(status=VersionStatus.FAILED)
    response = approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert response.status_code == 409
    assert response.json()["error"] == "version 1 is no longer ready (failed); it cannot be promoted"
    assert PromotionRequest.objects.get().state == "pending"


def test_approval_refused_when_alias_moved_meanwhile(owner, approver, two_versions):
    first = put(owner, "production", version=1).json()
    second = put(owner, "production", version=2).json()
    assert approver.post(f"/api/v1/promotions/{second['id']}/approve", {}).status_code == 200
    response = approver.post(f"/api/v1/promotions/{first['id']}/approve", {})
    assert response.status_code == 409
    assert response.json()["error"] == (
        "alias 'production' moved from version None to 2 since the request was made; request again"
    )


def test_expired_request_cannot_be_approved_and_is_marked(owner, approver, two_versions):
    from registry.promotions import promotions_expire

    request = put(owner, "production", version=1).json()
    PromotionRequest.objects.filter(pk=request["id"]).update(expires_at=timezone.now())
    response = approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert response.status_code == 409
    assert "expired at" in response.json()["error"]
    assert promotions_expire() == 1
    assert PromotionRequest.objects.get().state == "expired"
    assert actions()[-1] == "promotion.expire"


def test_requester_can_cancel_others_cannot(owner, approver, two_versions):
    request = put(owner, "production", version=1).json()
    assert approver.post(f"/api/v1/promotions/{request['id']}/cancel", {}).status_code == 403
    response = owner.post(f"/api/v1/promotions/{request['id']}/cancel", {})
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"


def test_duplicate_pending_request_is_409(owner, two_versions):
    first = put(owner, "production", version=1)
    assert first.status_code == 202
    second = put(owner, "production", version=1)
    assert second.status_code == 409
    assert second.json()["detail"] == {"promotion": first.json()["id"]}


def test_rollback_returns_to_previous_version(owner, approver, two_versions):
    put(owner, "staging", version=1)
    put(owner, "staging", version=2)
    response = owner.post(f"{ALIASES}/staging/rollback", {"reason": "bad latency"})
    assert response.status_code == 200
    assert (response.json()["from_version"], response.json()["to_version"], response.json()["kind"]) == (
        2,
        1,
        "rollback",
    )
    assert Alias.objects.get(name="staging").version.version == 1
    assert actions()[-1] == "alias.rollback"


def test_rollback_without_history_is_409(owner, two_versions):
    put(owner, "staging", version=1)
    response = owner.post(f"{ALIASES}/staging/rollback", {})
    assert response.status_code == 409
    assert response.json()["error"] == "alias 'staging' has no earlier version to roll back to"
    assert owner.post(f"{ALIASES}/nope/rollback", {}).status_code == 404


def test_rollback_of_protected_alias_needs_approver(owner, approver, two_versions):
    for version in (1, 2):
        request = put(owner, "production", version=version).json()
        approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    refused = owner.post(f"{ALIASES}/production/rollback", {})
    assert refused.status_code == 403
    assert Alias.objects.get(name="production").version.version == 2
    assert approver.post(f"{ALIASES}/production/rollback", {"reason": "incident"}).status_code == 200
    assert Alias.objects.get(name="production").version.version == 1


def test_history_at_answers_what_served_at_time_t(owner, two_versions):
    put(owner, "staging", version=1)
    t1 = timezone.now()
    put(owner, "staging", version=2)
    t2 = timezone.now()
    before = AliasMove.objects.order_by("moved_at").first().moved_at
    url = f"{ALIASES}/staging/history?at="
    assert owner.get(url + (before.replace(year=2000)).isoformat().replace("+", "%2B")).json()["version"] is None
    assert owner.get(url + t1.isoformat().replace("+", "%2B")).json()["version"] == 1
    assert owner.get(url + t2.isoformat().replace("+", "%2B")).json()["version"] == 2
    bad = owner.get(url + "yesterday")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("'at' must be an ISO 8601 time")


def test_admin_sets_flags_others_cannot(owner, two_versions):
    admin = make_person("root", "admin")
    assert owner.patch(f"{ALIASES}/staging", {"protected": True}).status_code == 403
    response = admin.patch(f"{ALIASES}/staging", {"protected": True, "served": True})
    assert response.status_code == 200
    assert (response.json()["protected"], response.json()["served"]) == (True, True)
    assert put(owner, "staging", version=1).status_code == 202
    assert actions()[-2:] == ["alias.flags", "promotion.request"]


def test_promotions_list_filters_and_rejects_unknown_state(owner, approver, two_versions):
    put(owner, "production", version=1)
    assert approver.get("/api/v1/promotions?state=approved").json()["count"] == 0
    assert approver.get("/api/v1/promotions?model=demo").json()["count"] == 1
    bad = approver.get("/api/v1/promotions?state=weird")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("unknown state 'weird'")


def test_admin_unprotect_opens_a_request_and_the_alias_stays_protected(owner, two_versions):
    admin = make_person("root", "admin")
    response = admin.patch(f"{ALIASES}/production", {"protected": False, "reason": "retire the model"})
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["kind"], body["alias"], body["version"], body["state"], body["requested_by"], body["reason"]) == (
        "unprotect",
        "production",
        None,
        "pending",
        "root",
        "retire the model",
    )
    assert Alias.objects.get(name="production").protected is True
    event = AuditEvent.objects.filter(action="promotion.request").latest("seq")
    assert (event.actor, event.target, event.before) == ("root", str(body["id"]), {"protected": True})
    assert event.after == {"alias": "production", "kind": "unprotect", "protected": False, "reason": "retire the model"}
    # Still protected: a move by the same admin only opens a promotion request.
    assert put(admin, "production", version=1).status_code == 202
    assert Alias.objects.get(name="production").version is None


def test_admin_cannot_approve_own_unprotect_request(owner, two_versions):
    admin = make_person("root", "admin")
    request = admin.patch(f"{ALIASES}/production", {"protected": False}).json()
    refused = admin.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert refused.status_code == 403
    assert refused.json()["error"] == "you requested this unprotect request; another approver must approve it"
    maintainer = owner.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert maintainer.status_code == 403
    assert maintainer.json()["error"] == "to approve an unprotect request you need the approver role"
    assert Alias.objects.get(name="production").protected is True
    assert PromotionRequest.objects.get(pk=request["id"]).state == "pending"


def test_approver_approves_unprotect_then_moves_are_direct(owner, approver, two_versions):
    admin = make_person("root", "admin")
    request = admin.patch(f"{ALIASES}/production", {"protected": False}).json()
    approved = approver.post(f"/api/v1/promotions/{request['id']}/approve", {"reason": "ok"})
    assert approved.status_code == 200, approved.content
    assert (approved.json()["state"], approved.json()["decided_by"], approved.json()["kind"]) == (
        "approved",
        "approver",
        "unprotect",
    )
    alias = Alias.objects.get(name="production")
    assert (alias.protected, alias.served) == (False, True)
    assert actions()[-2:] == ["promotion.approve", "alias.flags"]
    flags = AuditEvent.objects.filter(action="alias.flags").latest("seq")
    assert (flags.actor, flags.before, flags.after) == (
        "approver",
        {"protected": True, "served": True},
        {"protected": False, "served": True, "promotion": request["id"]},
    )
    assert put(owner, "production", version=1).status_code == 200
    again = approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert again.status_code == 409


def test_rejected_unprotect_leaves_the_alias_protected(approver, two_versions):
    admin = make_person("root", "admin")
    request = admin.patch(f"{ALIASES}/production", {"protected": False}).json()
    response = approver.post(f"/api/v1/promotions/{request['id']}/reject", {"reason": "no"})
    assert response.status_code == 200
    assert response.json()["state"] == "rejected"
    assert Alias.objects.get(name="production").protected is True
    assert actions()[-1] == "promotion.reject"


def test_unprotect_must_be_sent_alone_and_only_once(two_versions):
    admin = make_person("root", "admin")
    mixed = admin.patch(f"{ALIASES}/production", {"protected": False, "served": False})
    assert mixed.status_code == 400
    assert mixed.json()["error"] == (
        "unprotecting a protected alias needs a second person's approval: send protected=false on its own"
    )
    assert Alias.objects.get(name="production").served is True
    first = admin.patch(f"{ALIASES}/production", {"protected": False})
    second = admin.patch(f"{ALIASES}/production", {"protected": False})
    assert second.status_code == 409
    assert second.json() == {
        "error": f"unprotect request {first.json()['id']} for 'production' is already pending",
        "detail": {"promotion": first.json()["id"]},
    }


def test_served_changes_on_a_protected_alias_stay_direct(two_versions):
    admin = make_person("root", "admin")
    response = admin.patch(f"{ALIASES}/production", {"served": False})
    assert response.status_code == 200
    assert (response.json()["protected"], response.json()["served"]) == (True, False)
    assert not PromotionRequest.objects.exists()


def test_unprotect_approved_after_it_was_unprotected_is_409(approver, two_versions):
    admin = make_person("root", "admin")
    request = admin.patch(f"{ALIASES}/production", {"protected": False}).json()
    Alias.objects.filter(name="production").update(protected=False)
    response = approver.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert response.status_code == 409
    assert response.json()["error"] == "alias 'production' is no longer protected; nothing to approve"


def test_promotions_list_shows_and_filters_kind(owner, approver, two_versions):
    put(owner, "production", version=1)
    make_person("root", "admin").patch(f"{ALIASES}/production", {"protected": False})
    kinds = [p["kind"] for p in approver.get("/api/v1/promotions").json()["results"]]
    assert kinds == ["unprotect", "move"]
    moves = approver.get("/api/v1/promotions?kind=move").json()["results"]
    assert [(p["kind"], p["version"]) for p in moves] == [("move", 1)]
    bad = approver.get("/api/v1/promotions?kind=delete")
    assert bad.status_code == 400
    assert bad.json()["error"] == "unknown kind 'delete'; kinds are move, unprotect, rollout, policy"


# --- Four eyes are two people: not one admin and an account that admin set up -------------------------

STRONG = "a long enough passphrase 8"


def _stand_in(kind: str, ada, approver) -> tuple[str, str, str]:
    """Have ada set up or re-key an approver's account one way; returns (decider, audit action, how it reads)."""
    User = get_user_model()
    if kind == "created":
        services.user_invite(username="pat", roles=[Role.APPROVER], password=STRONG, actor=ada.actor)
        return "pat", "user.create", "created your account"
    if kind == "link":
        services.user_password_link(username="approver", actor=ada.actor)
        return "approver", "user.password.link", "made a set-password link for you"
    if kind == "password":
        services.user_password_set(user=User.objects.get(username="approver"), password=STRONG, actor=ada.actor)
        return "approver", "user.password.change", "set your password"
    if kind == "token":
        services.token_create(username="approver", name="for you", actor=ada.actor)
        return "approver", "token.create", "made an API token for you"
    assert kind == "granted"
    make_person("bob", Role.MAINTAINER)
    services.user_update_access(username="bob", roles=[Role.MAINTAINER, Role.APPROVER], actor=ada.actor)
    return "bob", "user.roles.grant", "granted you the approver role"


@pytest.mark.parametrize("kind", ["created", "link", "password", "token", "granted"])
def test_an_approver_whose_account_the_requester_set_up_or_rekeyed_cannot_decide(approver, two_versions, kind):
    ada = make_person("ada", Role.ADMIN)
    username, action, how = _stand_in(kind, ada, approver)
    decider = approver if username == "approver" else make_person(username)  # a token of its own, made by system
    request = put(ada, "production", version=1, reason="mine").json()
    at = AuditEvent.objects.filter(actor="ada", action=action).latest("seq").at.isoformat(timespec="seconds")
    for verb in ("approve", "reject"):
        refused = decider.post(f"/api/v1/promotions/{request['id']}/{verb}", {"reason": "fine"})
        assert refused.status_code == 403, refused.content
        assert refused.json()["error"] == (
            f"ada requested this promotion and {how} ({at}); another approver must {verb} it"
        )
    assert PromotionRequest.objects.get(pk=request["id"]).state == "pending"
    assert Alias.objects.get(name="production").version is None
    denied = AuditEvent.objects.filter(action="access.denied", actor=username)
    assert denied.count() == 2
    # Somebody ada never touched decides it.
    other = make_person("olga", Role.APPROVER)
    assert other.post(f"/api/v1/promotions/{request['id']}/approve", {}).status_code == 200
    assert Alias.objects.get(name="production").version.version == 1


def test_what_one_admin_did_to_an_account_binds_only_their_own_requests_within_the_window(owner, two_versions):
    ada = make_person("ada", Role.ADMIN)
    make_person("bob", Role.MAINTAINER)
    services.user_update_access(username="bob", roles=[Role.APPROVER], actor=ada.actor)
    bob = make_person("bob")  # bob's own token, made by system
    # Another person's request: bob is a second person to it.
    owners = put(owner, "production", version=1).json()
    assert bob.post(f"/api/v1/promotions/{owners['id']}/approve", {}).status_code == 200
    # ada's own request, made long after the grant (more than its lifetime): the grant no longer binds bob.
    adas = put(ada, "production", version=2).json()
    later = timezone.now() + timedelta(days=30)
    PromotionRequest.objects.filter(pk=adas["id"]).update(requested_at=later, expires_at=later + timedelta(days=7))
    assert bob.post(f"/api/v1/promotions/{adas['id']}/approve", {}).status_code == 200


def test_a_renamed_stand_in_is_still_recognised(two_versions):
    ada = make_person("ada", Role.ADMIN)
    services.user_invite(username="pat", roles=[Role.APPROVER], password=STRONG, actor=ada.actor)
    root = get_user_model().objects.create_superuser("root", "root@example.com", STRONG)
    pat = get_user_model().objects.get(username="pat")
    before = services.user_access_snapshot(user_id=pat.pk)
    pat.username = "patricia"
    pat.save(update_fields=["username"])
    services.user_access_record(user_id=pat.pk, before=before, actor=Actor(user=root))
    patricia = make_person("patricia")
    request = put(ada, "production", version=1).json()
    refused = patricia.post(f"/api/v1/promotions/{request['id']}/approve", {})
    assert refused.status_code == 403
    assert refused.json()["error"].startswith("ada requested this promotion and created your account (")
