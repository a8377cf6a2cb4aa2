"""Service accounts (pipelines' users: no sign-in, owned by an admin) and token rotation with an overlap."""

from __future__ import annotations

from datetime import timedelta
from html import escape
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from modelyard import cli
from registry.access import services
from registry.access.lockout import SERVICE_ACCOUNT_LOGIN
from registry.audit.chain import SYSTEM
from registry.models import ApiToken, AuditEvent, Role, ServiceAccount
from tests.support.people import Person, make_person

pytestmark = pytest.mark.django_db

ACCOUNTS = "/api/v1/service-accounts"
TOKENS = "/api/v1/tokens"


@pytest.fixture
def root() -> Person:
    return make_person("root", Role.ADMIN)


def session_of(username: str) -> Client:
    browser = Client()
    browser.force_login(get_user_model().objects.get(username=username))
    return browser


def bearer(raw: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_an_admin_creates_a_service_account_that_cannot_sign_in(root, outsider):
    answer = root.post(ACCOUNTS, {"username": "scoring-pipeline", "roles": ["inference"], "description": "nightly"})
    assert answer.status_code == 201, answer.content
    assert answer.json() | {"created_at": None} == {
        "username": "scoring-pipeline",
        "owner": "root",
        "description": "nightly",
        "roles": ["inference"],
        "is_active": True,
        "created_at": None,
    }
    user = get_user_model().objects.get(username="scoring-pipeline")
    assert not user.has_usable_password()
    assert ServiceAccount.objects.get(user=user).owner.username == "root"
    created = AuditEvent.objects.get(action="service_account.create")
    assert (created.actor, created.target, created.after) == (
        "root",
        "scoring-pipeline",
        {"owner": "root", "roles": ["inference"], "description": "nightly"},
    )
    assert AuditEvent.objects.get(action="user.create", target="scoring-pipeline").after["roles"] == ["inference"]
    assert [a["username"] for a in root.get(ACCOUNTS).json()["results"]] == ["scoring-pipeline"]
    # The login form says why it cannot sign in (whatever password is tried).
    page = Client().post("/accounts/login/", {"username": "scoring-pipeline", "password": "anything at all"})
    assert page.status_code == 200
    assert escape(SERVICE_ACCOUNT_LOGIN.format(username="scoring-pipeline")) in page.content.decode()
    assert "_auth_user_id" not in page.wsgi_request.session
    # Only admins manage them.
    refused = outsider.post(ACCOUNTS, {"username": "mine"})
    assert (refused.status_code, refused.json()["error"]) == (403, "service accounts need the admin role")
    assert outsider.get(ACCOUNTS).status_code == 403
    assert not ServiceAccount.objects.filter(user__username="mine").exists()


def test_a_service_account_needs_an_admin_owner_and_a_new_name(root, outsider):
    not_admin = root.post(ACCOUNTS, {"username": "p1", "owner": "outsider"})
    assert (not_admin.status_code, not_admin.json()["error"]) == (
        400,
        "the owner of a service account must be an active admin; 'outsider' is not",
    )
    taken = root.post(ACCOUNTS, {"username": "outsider"})
    assert (taken.status_code, taken.json()["error"]) == (409, "a user named 'outsider' already exists")
    assert not ServiceAccount.objects.exists()
    assert not AuditEvent.objects.filter(action="service_account.create").exists()


def test_an_admin_gives_a_service_account_a_scoped_token_from_a_session(root, outsider):
    services.service_account_create(username="pipe", owner="root", roles=[Role.INFERENCE], actor=SYSTEM)
    answer = session_of("root").post(
        TOKENS, {"user": "pipe", "roles": ["inference"], "models": ["fraud-*"]}, content_type="application/json"
    )
    assert answer.status_code == 201, answer.content
    assert (answer.json()["user"], answer.json()["roles"]) == ("pipe", ["inference"])
    assert AuditEvent.objects.get(action="token.create", target=answer.json()["prefix"]).actor == "root"
    # Not for a person, and not by a non-admin.
    person = session_of("root").post(TOKENS, {"user": "outsider"}, content_type="application/json")
    assert (person.status_code, person.json()["error"]) == (
        400,
        "user: 'outsider' is not a service account; people create their own tokens, signed in as themselves",
    )
    other = session_of("outsider").post(TOKENS, {"user": "pipe"}, content_type="application/json")
    assert (other.status_code, other.json()["error"]) == (403, "creating a token for another user needs the admin role")
    assert ApiToken.objects.filter(user__username="pipe").count() == 1


def test_a_rotated_token_works_during_the_overlap_and_not_after(root):
    services.service_account_create(username="pipe", owner="root", roles=[Role.VIEWER], actor=SYSTEM)
    old, old_raw = services.token_create(
        username="pipe", name="ci", model_patterns=["fraud-*"], expires_in=timedelta(days=30), actor=SYSTEM
    )
    answer = session_of("root").post(
        f"{TOKENS}/{old.prefix}/rotate", {"overlap_hours": 2}, content_type="application/json"
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["user"], body["name"], body["models"], body["rotated_from"]) == ("pipe", "ci", ["fraud-*"], old.prefix)
    new = ApiToken.objects.get(prefix=body["prefix"])
    assert new.key_hash == ApiToken.hash_key(body["token"])
    assert timedelta(days=30) - timedelta(minutes=1) < new.expires_at - timezone.now() <= timedelta(days=30)
    old.refresh_from_db()
    assert timedelta(hours=2) - timedelta(minutes=1) < old.expires_at - timezone.now() <= timedelta(hours=2)
    # During the overlap both work.
    assert Client().get("/api/v1/me", **bearer(old_raw)).status_code == 200
    assert Client().get("/api/v1/me", **bearer(body["token"])).status_code == 200
    rotate = AuditEvent.objects.get(action="token.rotate", target=old.prefix)
    assert rotate.actor == "root"
    assert rotate.after == {
        "user": "pipe",
        "name": "ci",
        "replaced_by": new.prefix,
        "expires_at": old.expires_at.isoformat(),
        "overlap_seconds": 7200,
    }
    created = AuditEvent.objects.get(action="token.create", target=new.prefix)
    assert created.after["rotated_from"] == old.prefix
    # After the overlap (time moved in the database) the old token is refused, the new one is not.
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = Client().get("/api/v1/me", **bearer(old_raw))
    assert refused.status_code == 401
    assert Client().get("/api/v1/me", **bearer(body["token"])).status_code == 200
    # An expired token is not rotated.
    again = session_of("root").post(f"{TOKENS}/{old.prefix}/rotate", {}, content_type="application/json")
    assert again.status_code == 409
    assert again.json()["error"].startswith(f"API token {old.prefix} expired at ")


def test_a_token_cannot_rotate_tokens_and_bad_overlaps_are_400(root):
    _, raw = services.token_create(username="root", actor=SYSTEM)
    prefix = raw.split("_")[1]
    refused = Client().post(f"{TOKENS}/{prefix}/rotate", {}, content_type="application/json", **bearer(raw))
    assert refused.status_code == 403
    assert refused.json()["error"].startswith("an API token cannot create tokens")
    bad = session_of("root").post(f"{TOKENS}/{prefix}/rotate", {"overlap_hours": -1}, content_type="application/json")
    assert (bad.status_code, bad.json()["error"]) == (
        400,
        "overlap_hours: Ensure this value is greater than or equal to 0.",
    )
    assert not AuditEvent.objects.filter(action="token.rotate").exists()


def test_rotatetoken_and_createserviceaccount_commands(root, capsys):
    assert cli.main(["createserviceaccount", "etl", "--owner", "root", "--role", "inference"]) == 0
    assert "Created service account etl (inference), owned by root" in capsys.readouterr().out
    assert cli.main(["createserviceaccount", "etl2", "--owner", "nobody"]) == 2
    assert (
        "modelyard createserviceaccount: no user named 'nobody' to own the service account" in capsys.readouterr().err
    )
    assert cli.main(["createtoken", "etl", "--only-role", "inference", "--only-model", "fraud-*"]) == 0
    old_raw = capsys.readouterr().out.strip().splitlines()[-1]
    old = ApiToken.objects.get(key_hash=ApiToken.hash_key(old_raw))
    assert cli.main(["rotatetoken", old.prefix, "--overlap-hours", "0"]) == 0
    out, err = capsys.readouterr()
    new = ApiToken.objects.get(key_hash=ApiToken.hash_key(out.strip().splitlines()[-1]))
    assert (new.roles, new.model_patterns, new.rotated_from_id) == (["inference"], ["fraud-*"], old.pk)
    assert f"Rotated token {old.prefix} of etl" in err
    # No overlap: the old token stops at once.
    assert Client().get("/api/v1/me", **bearer(old_raw)).status_code == 401
    assert AuditEvent.objects.get(action="token.rotate", target=old.prefix).after["overlap_seconds"] == 0
    assert cli.main(["rotatetoken", "feedbeef"]) == 1
    assert "modelyard rotatetoken: no API token with prefix 'feedbeef'" in capsys.readouterr().err


def test_deleting_a_service_account_stops_its_tokens_and_is_audited(root):
    services.service_account_create(username="pipe", owner="root", roles=[Role.VIEWER], actor=SYSTEM)
    token, raw = services.token_create(username="pipe", actor=SYSTEM)
    assert Client().get("/api/v1/models", **bearer(raw)).status_code == 200
    assert root.delete(f"{ACCOUNTS}/pipe").status_code == 204
    assert Client().get("/api/v1/models", **bearer(raw)).status_code == 401
    assert not get_user_model().objects.filter(username="pipe").exists()
    deleted = AuditEvent.objects.get(action="service_account.delete")
    assert (deleted.actor, deleted.target, deleted.after) == (
        "root",
        "pipe",
        {"owner": "root", "tokens": [token.prefix]},
    )
    assert AuditEvent.objects.get(action="user.delete", target="pipe").actor == "root"
    missing = root.delete(f"{ACCOUNTS}/pipe")
    assert (missing.status_code, missing.json()["error"]) == (404, "no service account named 'pipe'")
