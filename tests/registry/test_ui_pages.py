"""The server-rendered UI: pages per role, login, and promotion decisions through the services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from registry.models import Alias, AuditEvent, InferenceWorker, PromotionRequest, Role
from tests.support.audit_factory import append_bulk_events
from tests.support.people import login_person
from tests.support.registry import pending_promotion

pytestmark = pytest.mark.django_db


@pytest.fixture
def requester():
    """A maintainer who is also an approver: may request, may not approve their own request."""
    return login_person("requester", Role.MAINTAINER, Role.APPROVER)


@pytest.fixture
def reviewer():
    return login_person("reviewer", Role.APPROVER)


@pytest.fixture
def maintainer():
    """May request promotions, may not decide them or roll back protected aliases."""
    return login_person("maintainer", Role.MAINTAINER)


@pytest.fixture
def auditor():
    return login_person("auditor", Role.AUDITOR)


@pytest.mark.parametrize("path", ["/ui/", "/ui/models/demo", "/ui/promotions", "/ui/audit", "/ui/fleet"])
def test_anonymous_is_sent_to_login(path):
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


def test_login_page_renders_and_logs_in(reviewer):
    assert Client().get("/accounts/login/").status_code == 200
    response = Client().post("/accounts/login/", {"username": "reviewer", "password": "correct horse battery staple"})
    assert (response.status_code, response["Location"]) == (302, "/ui/")


def test_models_list_shows_latest_and_production_version(requester, reviewer):
    promotion = pending_promotion(requester)
    reviewer.client.post(f"/ui/promotions/{promotion.pk}/approve")
    response = requester.client.get("/ui/")
    assert response.status_code == 200
    [model] = response.context["models"]
    assert (model.name, model.latest_version, model.production_version) == ("demo", 2, 1)
    assert b'href="/ui/models/demo"' in response.content


def test_model_page_lists_versions_aliases_and_history(requester, reviewer):
    promotion = pending_promotion(requester)
    reviewer.client.post(f"/ui/promotions/{promotion.pk}/approve")
    response = requester.client.get("/ui/models/demo")
    assert response.status_code == 200
    assert [v.version for v in response.context["versions"]] == [2, 1]
    assert [(a.name, a.version.version, a.protected, a.served) for a in response.context["aliases"]] == [
        ("production", 1, True, True)
    ]
    assert [(m.kind, m.to_version.version) for m in response.context["history"]] == [("approval", 1)]
    assert b"Roll back" in response.content


def test_refused_rollback_shows_the_service_message(requester):
    pending_promotion(requester)
    response = requester.client.post("/ui/models/demo/aliases/production/rollback", {"reason": "oops"})
    assert response.status_code == 409
    assert response.context["error"] == "alias 'production' has no earlier version to roll back to"
    assert b"has no earlier version to roll back to" in response.content
    assert not AuditEvent.objects.filter(action="access.denied").exists()  # a conflict is not a refusal


def test_refused_rollback_is_403_and_recorded(requester, maintainer):
    pending_promotion(requester)
    response = maintainer.client.post("/ui/models/demo/aliases/production/rollback", {"reason": "oops"})
    assert response.status_code == 403
    assert response.context["error"] == "rolling back the protected alias 'production' needs the approver role"
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("maintainer", "POST /ui/models/demo/aliases/production/rollback")
    assert denied.after["reason"] == "rolling back the protected alias 'production' needs the approver role"


def test_refused_reject_is_403_and_recorded(requester, maintainer):
    promotion = pending_promotion(requester)
    response = maintainer.client.post(f"/ui/promotions/{promotion.pk}/reject", {"reason": "no"})
    assert response.status_code == 403
    promotion.refresh_from_db()
    assert promotion.state == "pending"
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("maintainer", f"POST /ui/promotions/{promotion.pk}/reject")
    assert denied.after["reason"] == "to reject a promotion you need the approver role"


def test_promotions_page_lists_pending_and_the_review_page_has_the_decision_buttons(requester, reviewer):
    promotion = pending_promotion(requester)
    response = reviewer.client.get("/ui/promotions")
    assert response.status_code == 200
    assert list(response.context["pending"]) == [promotion]
    # Nobody approves blind from the list: the decision is on the review page, beside the diff.
    assert f'href="/ui/promotions/{promotion.pk}"'.encode() in response.content
    review = reviewer.client.get(f"/ui/promotions/{promotion.pk}")
    assert b"Approve" in review.content and b"Reject" in review.content
    assert b"csrfmiddlewaretoken" in review.content


def test_approve_moves_the_alias_and_writes_the_audit_event(requester, reviewer):
    promotion = pending_promotion(requester)
    response = reviewer.client.post(f"/ui/promotions/{promotion.pk}/approve", {"reason": "looks good"})
    assert (response.status_code, response["Location"]) == (302, "/ui/promotions")
    promotion.refresh_from_db()
    assert (promotion.state, promotion.decided_by.username, promotion.decision_reason) == (
        "approved",
        "reviewer",
        "looks good",
    )
    assert Alias.objects.get(name="production").version.version == 1
    approve = AuditEvent.objects.get(action="promotion.approve")
    assert (approve.actor, approve.target, approve.after) == (
        "reviewer",
        str(promotion.pk),
        {"state": "approved", "reason": "looks good"},
    )
    assert AuditEvent.objects.order_by("-seq").values_list("action", flat=True)[0] == "alias.set"
    page = reviewer.client.get("/ui/promotions")
    assert f"Promotion request {promotion.pk} approved.".encode() in page.content
    assert list(page.context["decided"]) == [promotion]


def test_unprotect_request_is_reviewed_on_the_promotions_page(requester, reviewer):
    pending_promotion(requester)
    admin = login_person("root", Role.ADMIN)
    assert admin.patch("/api/v1/models/demo/aliases/production", {"protected": False}).status_code == 202
    unprotect = PromotionRequest.objects.get(kind="unprotect")
    page = reviewer.client.get("/ui/promotions")
    assert page.status_code == 200
    assert f'<tr data-promotion="{unprotect.pk}">'.encode() in page.content
    assert b"unprotect (at version" in page.content
    response = reviewer.client.post(f"/ui/promotions/{unprotect.pk}/approve", {"reason": "retiring"})
    assert response.status_code == 302
    assert Alias.objects.get(name="production").protected is False
    decided = reviewer.client.get("/ui/promotions")
    assert list(decided.context["decided"]) == [unprotect]


def test_reject_leaves_the_alias(requester, reviewer):
    promotion = pending_promotion(requester)
    assert reviewer.client.post(f"/ui/promotions/{promotion.pk}/reject", {"reason": "not yet"}).status_code == 302
    promotion.refresh_from_db()
    assert promotion.state == "rejected"
    assert Alias.objects.get(name="production").version is None


def test_requester_cannot_approve_own_promotion(requester):
    promotion = pending_promotion(requester)
    last_seq = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True)[0]
    response = requester.client.post(f"/ui/promotions/{promotion.pk}/approve")
    assert response.status_code == 403
    assert response.context["error"] == "you requested this promotion; another approver must approve it"
    assert b"you requested this promotion; another approver must approve it" in response.content
    promotion.refresh_from_db()
    assert promotion.state == "pending"
    assert Alias.objects.get(name="production").version is None
    # Nothing changed, and the refusal is recorded as the API's are.
    [denied] = AuditEvent.objects.filter(seq__gt=last_seq)
    assert (denied.action, denied.actor, denied.target) == (
        "access.denied",
        "requester",
        f"POST /ui/promotions/{promotion.pk}/approve",
    )
    assert denied.after == {
        "method": "POST",
        "path": f"/ui/promotions/{promotion.pk}/approve",
        "reason": "you requested this promotion; another approver must approve it",
    }


def test_unknown_decision_and_get_are_refused(requester, reviewer):
    promotion = pending_promotion(requester)
    assert reviewer.client.post(f"/ui/promotions/{promotion.pk}/merge").status_code == 404
    assert reviewer.client.get(f"/ui/promotions/{promotion.pk}/approve").status_code == 405
    assert PromotionRequest.objects.get().state == "pending"


def test_audit_page_lists_filters_and_verifies(requester, reviewer, auditor):
    promotion = pending_promotion(requester)
    reviewer.client.post(f"/ui/promotions/{promotion.pk}/approve")
    response = auditor.client.get("/ui/audit", {"action": "promotion.", "model": "demo", "verify": "1"})
    assert response.status_code == 200
    assert [(e.actor, e.action) for e in response.context["events"]] == [
        ("reviewer", "promotion.approve"),
        ("requester", "promotion.request"),
    ]
    assert response.context["verified"].ok
    assert b"chain ok" in response.content


def test_audit_page_is_forbidden_to_a_maintainer_and_the_refusal_recorded(requester):
    response = requester.client.get("/ui/audit", HTTP_USER_AGENT="Firefox/128")
    assert response.status_code == 403
    assert b"needs the auditor or admin role" in response.content
    assert "events" not in response.context
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target, denied.user_agent) == ("requester", "GET /ui/audit", "Firefox/128")
    assert denied.after == {
        "method": "GET",
        "path": "/ui/audit",
        "reason": "reading the audit log needs the auditor or admin role",
    }


def test_audit_page_shows_at_most_200_events(auditor):
    append_bulk_events(250)
    response = auditor.client.get("/ui/audit")
    assert len(response.context["events"]) == 200


def test_fleet_page_shows_online_and_offline_workers(requester):
    now = timezone.now()
    for worker_id, seen in (("w-live", now), ("w-gone", now - timedelta(hours=1))):
        InferenceWorker.objects.create(
            worker_id=worker_id,
            host="h",
            pid=1,
            device="cpu",
            provider="CPUExecutionProvider",
            loaded=[{"model": "demo", "version": 3, "aliases": ["production"], "state": "ready"}],
            started_at=seen,
            heartbeat_at=seen,
        )
    response = requester.client.get("/ui/fleet")
    assert response.status_code == 200
    assert [(row["worker"].worker_id, row["online"]) for row in response.context["workers"]] == [
        ("w-gone", False),
        ("w-live", True),
    ]
    assert b"demo v3 (production)" in response.content


@pytest.mark.parametrize(
    ("reason", "error"),
    [
        ("a\x00b", "reason: Null characters are not allowed."),
        ("x" * 2001, "reason: Ensure this value has at most 2000 characters (it has 2001)."),
    ],
)
def test_bad_reason_is_400_and_changes_nothing(requester, reviewer, reason, error):
    promotion = pending_promotion(requester)
    response = reviewer.client.post(f"/ui/promotions/{promotion.pk}/reject", {"reason": reason})
    assert response.status_code == 400
    assert response.context["error"] == error
    promotion.refresh_from_db()
    assert promotion.state == "pending"
    response = reviewer.client.post("/ui/models/demo/aliases/production/rollback", {"reason": reason})
    assert (response.status_code, response.context["error"]) == (400, error)
