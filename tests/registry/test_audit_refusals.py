"""Failed logins and refused writes leave audit events, in a transaction of their own."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from registry.access import services
from registry.audit.chain import SYSTEM
from registry.audit.verify import audit_verify
from registry.models import ApiToken, AuditEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("one_failure_minute")]  # auth.failed per minute


def _only(action: str) -> AuditEvent:
    return AuditEvent.objects.get(action=action)


def test_unknown_bearer_token_records_auth_failed(client):
    response = client.get(
        "/api/v1/models", HTTP_AUTHORIZATION="Bearer my_0123abcd_notthesecret", HTTP_USER_AGENT="curl/8.5"
    )
    assert response.status_code == 401
    assert response.json() == {"error": "invalid or revoked API token", "detail": None}
    event = _only("auth.failed")
    assert (event.actor, event.actor_id, event.token_id) == ("anonymous", None, None)
    assert (event.target_type, event.target) == ("token", "0123abcd")
    assert (event.ip, event.user_agent) == ("127.0.0.1", "curl/8.5")
    assert event.after == {"reason": "invalid or revoked API token", "method": "GET", "path": "/api/v1/models"}
    assert "notthesecret" not in json.dumps(event.canonical())
    assert audit_verify().ok


def test_unparseable_bearer_token_records_auth_failed_without_a_prefix(client):
    assert client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer garbage").status_code == 401
    assert (_only("auth.failed").target_type, _only("auth.failed").target) == ("token", "")


def test_revoked_token_records_auth_failed_with_its_prefix(owner):
    token = ApiToken.objects.get(user__username="owner")
    services.token_revoke(token=token, actor=SYSTEM)
    response = owner.post("/api/v1/models", {"name": "m1"})
    assert response.status_code == 401
    assert _only("auth.failed").target == token.prefix
    assert _only("auth.failed").after["method"] == "POST"
    assert not AuditEvent.objects.filter(action="access.denied").exists()


def test_request_without_credentials_is_not_a_failed_login(client, db):
    assert client.get("/api/v1/models").status_code == 401
    assert not AuditEvent.objects.filter(action="auth.failed").exists()


def test_failed_admin_login_records_auth_failed(db):
    User = get_user_model()
    User.objects.create_user(username="staff", password="right-password", is_staff=True)
    browser = Client()
    response = browser.post(
        "/admin/login/?next=/admin/",
        {"username": "staff", "password": "wrong-password"},
        HTTP_USER_AGENT="Firefox/128",
    )
    assert response.status_code == 200  # the form again, with an error
    event = _only("auth.failed")
    assert (event.actor, event.target_type, event.target) == ("anonymous", "user", "staff")
    assert (event.ip, event.user_agent) == ("127.0.0.1", "Firefox/128")
    assert event.after == {"reason": "wrong username or password", "method": "POST", "path": "/admin/login/"}
    assert "wrong-password" not in json.dumps(event.canonical())


def test_failed_login_outside_a_request_is_recorded(db):
    assert Client().login(username="nobody", password="x") is False
    event = _only("auth.failed")
    assert (event.actor, event.target, event.ip) == ("anonymous", "nobody", "")
    assert event.after == {"reason": "wrong username or password"}


def test_successful_admin_login_records_nothing(db):
    get_user_model().objects.create_user(username="staff", password="right-password", is_staff=True)
    response = Client().post("/admin/login/?next=/admin/", {"username": "staff", "password": "right-password"})
    assert response.status_code == 302
    assert not AuditEvent.objects.filter(action="auth.failed").exists()


def test_refused_write_records_access_denied(outsider):
    response = outsider.post("/api/v1/models", {"name": "x"}, HTTP_USER_AGENT="sdk/2")
    assert response.status_code == 403
    assert response.json() == {"error": "this action needs the maintainer or admin role", "detail": None}
    event = _only("access.denied")
    assert event.actor == "outsider"
    assert event.actor_id == get_user_model().objects.get(username="outsider").pk
    assert event.token_id == ApiToken.objects.get(user__username="outsider").pk
    assert (event.target_type, event.target, event.user_agent) == ("request", "POST /api/v1/models", "sdk/2")
    assert event.after == {
        "method": "POST",
        "path": "/api/v1/models",
        "reason": "this action needs the maintainer or admin role",
    }
    assert audit_verify().ok


def test_refused_patch_records_access_denied(owner, outsider, registered):
    assert outsider.patch(f"/api/v1/models/{registered}", {"description": "x"}).status_code == 403
    assert _only("access.denied").target == f"PATCH /api/v1/models/{registered}"


def test_refused_read_records_nothing(outsider):
    before = AuditEvent.objects.count()
    assert outsider.get("/api/v1/audit").status_code == 403
    assert AuditEvent.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_refusal_is_recorded_without_a_surrounding_transaction():
    # No test transaction here: audit_record() only works because the refusal opens its own.
    client = Client()
    assert client.post("/api/v1/models", {}, HTTP_AUTHORIZATION="Bearer my_feed_beef").status_code == 401
    assert AuditEvent.objects.filter(action="auth.failed", target="feed").count() == 1


# --- What a client sends cannot break the audit insert ------------------------------------------


def test_bogus_token_on_a_path_with_nul_is_401_and_recorded(db):
    # PostgreSQL stores no NUL: the insert used to fail, losing the 401 and its event together.
    client = Client(raise_request_exception=False)
    response = client.post(
        "/api/v1/models/a%00b/aliases/x", "{}", content_type="application/json", HTTP_AUTHORIZATION="Bearer my_feed_x"
    )
    assert response.status_code == 401
    assert response.json() == {"error": "invalid or revoked API token", "detail": None}
    event = _only("auth.failed")
    assert event.after == {
        "reason": "invalid or revoked API token",
        "method": "POST",
        "path": "/api/v1/models/a\ufffdb/aliases/x",
    }
    assert audit_verify().ok


def test_refused_write_on_a_path_with_nul_is_403_and_recorded(outsider):
    outsider.client.raise_request_exception = False
    response = outsider.patch("/api/v1/models/a%00b", {"description": "x"})
    assert response.status_code == 403
    event = _only("access.denied")
    assert event.target == "PATCH /api/v1/models/a\ufffdb"
    assert event.after["path"] == "/api/v1/models/a\ufffdb"
    assert audit_verify().ok


def test_nul_in_the_user_agent_and_the_token_prefix_is_recorded_replaced(db):
    client = Client(raise_request_exception=False)
    response = client.get(
        "/api/v1/models", HTTP_AUTHORIZATION="Bearer my_fe\x00ed_secret", HTTP_USER_AGENT="curl\x00/8"
    )
    assert response.status_code == 401
    event = _only("auth.failed")
    assert (event.user_agent, event.target) == ("curl\ufffd/8", "")


def test_failed_login_records_at_most_256_characters_of_path_and_user_agent(db):
    client = Client()
    long_path = "/api/v1/models/" + "m" * 2000
    assert client.get(long_path, HTTP_AUTHORIZATION="Bearer my_feed_x", HTTP_USER_AGENT="u" * 2000).status_code == 401
    event = _only("auth.failed")
    assert event.after["path"] == long_path[:256]
    assert event.user_agent == "u" * 256
