"""The tokens API: list your own (admins: all), create from a browser session, revoke by prefix; expiry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from registry.access import services
from registry.audit.chain import SYSTEM
from registry.errors import InvalidInput
from registry.models import ApiToken, AuditEvent
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens"
FIELDS = {
    "prefix",
    "name",
    "user",
    "roles",
    "models",
    "created_at",
    "expires_at",
    "last_used_at",
    "revoked_at",
    "rotated_from",
    "priority",
}


def prefix_of(person) -> str:
    return person.token.split("_")[1]


def test_list_shows_only_own_tokens_and_never_secrets(owner, outsider):
    services.token_create(username="owner", name="ci", actor=SYSTEM)
    response = owner.get(TOKENS)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert {t["user"] for t in body["results"]} == {"owner"}
    assert [t["name"] for t in body["results"]] == ["ci", ""]  # newest first
    assert all(set(t) == FIELDS for t in body["results"])
    assert owner.token not in response.content.decode()
    assert ApiToken.objects.get(prefix=prefix_of(owner)).key_hash not in response.content.decode()
    # The owner's own token has been used (this request), the new one not yet.
    used = {t["prefix"]: t["last_used_at"] for t in body["results"]}
    assert used[prefix_of(owner)] is not None
    assert [v for k, v in used.items() if k != prefix_of(owner)] == [None]


def test_user_filter_never_shows_someone_elses_tokens_to_a_non_admin(owner, outsider):
    assert owner.get(f"{TOKENS}?user=outsider").json()["count"] == 0


def test_admin_lists_every_token_and_filters_by_user(owner, outsider):
    admin = make_person("root", "admin")
    everyone = admin.get(TOKENS).json()
    assert sorted(t["user"] for t in everyone["results"]) == ["outsider", "owner", "root"]
    only = admin.get(f"{TOKENS}?user=outsider").json()
    assert [t["prefix"] for t in only["results"]] == [prefix_of(outsider)]


def test_list_query_count_does_not_grow_with_tokens(owner):
    owner.get(TOKENS)  # the first use records last_used_at, once a minute
    with CaptureQueriesContext(connection) as few:
        assert owner.get(TOKENS).status_code == 200
    for i in range(5):
        services.token_create(username="owner", name=f"t{i}", actor=SYSTEM)
    with CaptureQueriesContext(connection) as many:
        assert owner.get(TOKENS).json()["count"] == 6
    assert len(many) == len(few) == 4  # the token, its roles, the count, the page


def test_list_needs_credentials(client):
    response = client.get(TOKENS)
    assert response.status_code == 401
    assert response.json()["error"] == "authentication required: send 'Authorization: Bearer <token>'"


def test_owner_revokes_own_token_and_it_stops_working(owner):
    other, raw = services.token_create(username="owner", name="laptop", actor=SYSTEM)
    response = owner.delete(f"{TOKENS}/{other.prefix}")
    assert response.status_code == 204
    other.refresh_from_db()
    assert other.revoked_at is not None
    event = AuditEvent.objects.filter(action="token.revoke").get()
    assert (event.actor, event.target, event.after) == ("owner", other.prefix, {"user": "owner", "name": "laptop"})
    refused = Client().get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert refused.status_code == 401
    assert AuditEvent.objects.filter(action="auth.failed", target=other.prefix).count() == 1
    # Revoking again changes nothing and records nothing.
    assert owner.delete(f"{TOKENS}/{other.prefix}").status_code == 204
    assert AuditEvent.objects.filter(action="token.revoke").count() == 1


def test_someone_elses_token_is_not_found_for_a_non_admin(owner, outsider):
    response = outsider.delete(f"{TOKENS}/{prefix_of(owner)}")
    assert response.status_code == 404
    assert response.json() == {"error": f"no API token with prefix '{prefix_of(owner)}'", "detail": None}
    assert ApiToken.objects.get(prefix=prefix_of(owner)).revoked_at is None
    assert owner.get("/api/v1/models").status_code == 200
    assert not AuditEvent.objects.filter(action="token.revoke").exists()


def test_unknown_prefix_is_404(owner):
    response = owner.delete(f"{TOKENS}/feedbeef")
    assert response.status_code == 404
    assert response.json()["error"] == "no API token with prefix 'feedbeef'"


def test_admin_revokes_anyones_token(owner):
    admin = make_person("root", "admin")
    response = admin.delete(f"{TOKENS}/{prefix_of(owner)}")
    assert response.status_code == 204
    assert owner.get("/api/v1/models").status_code == 401
    assert AuditEvent.objects.get(action="token.revoke").actor == "root"


def test_browser_session_creates_a_token_with_expiry(owner):
    browser = Client()
    browser.force_login(get_user_model().objects.get(username="owner"))
    response = browser.post(TOKENS, {"name": "notebook", "expires_days": 7}, content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == FIELDS | {"token"}
    assert (body["user"], body["name"], body["revoked_at"]) == ("owner", "notebook", None)
    token = ApiToken.objects.get(prefix=body["prefix"])
    assert token.key_hash == ApiToken.hash_key(body["token"])
    assert timedelta(days=7) - timedelta(minutes=1) < token.expires_at - timezone.now() <= timedelta(days=7)
    event = AuditEvent.objects.get(action="token.create", target=token.prefix)
    assert (event.actor, event.after["name"], event.after["expires_at"]) == (
        "owner",
        "notebook",
        token.expires_at.isoformat(),
    )
    assert Client().get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {body['token']}").status_code == 200


def test_a_token_cannot_create_tokens(owner):
    response = owner.post(TOKENS, {"name": "more"})
    assert response.status_code == 403
    assert response.json() == {
        "error": "an API token cannot create tokens: sign in with your password, or run `modelyard createtoken`",
        "detail": None,
    }
    assert ApiToken.objects.count() == 1
    assert AuditEvent.objects.get(action="access.denied").target == "POST /api/v1/tokens"


@pytest.mark.parametrize("days", [0, -1, 3651, "soon"])
def test_bad_expiry_is_400(owner, days):
    browser = Client()
    browser.force_login(get_user_model().objects.get(username="owner"))
    response = browser.post(TOKENS, {"expires_days": days}, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"].startswith("expires_days: ")
    assert ApiToken.objects.count() == 1


def test_expired_token_is_refused_and_recorded(client):
    token, raw = services.token_create(
        username="ann", create_user=True, roles=["viewer"], expires_in=timedelta(hours=1), actor=SYSTEM
    )
    assert client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    token.refresh_from_db()
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401
    message = f"API token {token.prefix} expired at {token.expires_at.isoformat()}"
    assert response.json() == {"error": message, "detail": None}
    event = AuditEvent.objects.get(action="auth.failed")
    assert (event.target_type, event.target, event.after["reason"]) == ("token", token.prefix, message)


def test_expired_token_with_a_wrong_secret_gets_the_generic_message(client):
    token, raw = services.token_create(username="ann", create_user=True, expires_in=timedelta(hours=1), actor=SYSTEM)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw[:-1]}x")
    assert response.json()["error"] == "invalid or revoked API token"


def test_token_lifetime_must_be_positive():
    with pytest.raises(InvalidInput, match="a token's lifetime must be positive"):
        services.token_create(username="ann", create_user=True, expires_in=timedelta(0), actor=SYSTEM)
    assert not ApiToken.objects.exists()
