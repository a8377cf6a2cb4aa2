"""OpenID Connect sign-in, in process: its settings and their start-up errors, the sign-in service, the login page.

The whole flow against a real provider in Chromium is tests/e2e/test_oidc_browser.py.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from modelyard.oidc_config import ROLE_NAMES, OidcConfig, env_oidc
from registry.access import oidc
from registry.audit.chain import Actor
from registry.errors import InvalidInput, PermissionDenied
from registry.models import AuditEvent, OidcIdentity, Role
from tests.support.people import PASSWORD, login_person, make_person
from tests.support.processes import base_env

User = get_user_model()
ISSUER = "https://login.example.test/realms/ml"
CONFIG = OidcConfig(
    issuer=ISSUER,
    client_id="modelyard",
    client_secret="s",
    provider_name="Acme SSO",
    groups_claim="groups",
    role_map=(("ml-release", "approver"), ("ml-eng", "maintainer")),
    scopes="openid email profile",
    redirect_uri="",
)
OIDC_VARIABLES = (
    "MODELYARD_OIDC_ISSUER",
    "MODELYARD_OIDC_CLIENT_ID",
    "MODELYARD_OIDC_CLIENT_SECRET",
    "MODELYARD_OIDC_PROVIDER_NAME",
    "MODELYARD_OIDC_GROUPS_CLAIM",
    "MODELYARD_OIDC_ROLE_MAP",
    "MODELYARD_OIDC_SCOPES",
    "MODELYARD_OIDC_REDIRECT_URI",
)


def test_the_role_names_the_settings_check_are_the_roles():
    assert tuple(Role.values) == ROLE_NAMES


# --- Settings -----------------------------------------------------------------------------------------


@pytest.fixture
def oidc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OIDC_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"{name}_FILE", raising=False)
    return monkeypatch


def complete(env: pytest.MonkeyPatch, **more: str) -> None:
    env.setenv("MODELYARD_OIDC_ISSUER", "https://login.example.test/realms/ml/")
    env.setenv("MODELYARD_OIDC_CLIENT_ID", "modelyard")
    env.setenv("MODELYARD_OIDC_CLIENT_SECRET", "s3cret")
    for name, value in more.items():
        env.setenv(f"MODELYARD_OIDC_{name}", value)


def test_off_when_nothing_is_set_and_read_whole_when_the_three_are(oidc_env):
    assert env_oidc() is None
    complete(oidc_env, ROLE_MAP=" ml-release=approver , ml-eng=maintainer,ml-eng=viewer,")
    config = env_oidc()
    assert config is not None
    assert config.issuer == "https://login.example.test/realms/ml/"
    assert config.discovery_url == "https://login.example.test/realms/ml/.well-known/openid-configuration"
    assert (config.provider_name, config.groups_claim, config.scopes) == (
        "single sign-on",
        "groups",
        "openid email profile",
    )
    assert config.role_map == (("ml-release", "approver"), ("ml-eng", "maintainer"), ("ml-eng", "viewer"))
    assert config.roles_for(["ml-eng", "canteen"]) == {"maintainer", "viewer"}
    assert config.managed_roles == {"approver", "maintainer", "viewer"}


def test_the_discovery_url_may_be_given_as_the_issuer(oidc_env):
    complete(oidc_env)
    oidc_env.setenv("MODELYARD_OIDC_ISSUER", "https://acme.okta.com/oauth2/default/.well-known/openid-configuration")
    config = env_oidc()
    assert config is not None and config.issuer == "https://acme.okta.com/oauth2/default"


@pytest.mark.parametrize(
    ("variables", "error"),
    [
        (
            {"ISSUER": "https://login.example.test"},
            "OpenID Connect is half set up: MODELYARD_OIDC_ISSUER set but MODELYARD_OIDC_CLIENT_ID, "
            "MODELYARD_OIDC_CLIENT_SECRET missing; sign-in with a provider needs all of MODELYARD_OIDC_ISSUER, "
            "MODELYARD_OIDC_CLIENT_ID, MODELYARD_OIDC_CLIENT_SECRET",
        ),
        (
            {"ROLE_MAP": "ml-eng=maintainer"},
            "MODELYARD_OIDC_ROLE_MAP set without MODELYARD_OIDC_ISSUER, MODELYARD_OIDC_CLIENT_ID, "
            "MODELYARD_OIDC_CLIENT_SECRET: set all three to sign in with OpenID Connect",
        ),
    ],
)
def test_a_half_set_configuration_stops_the_start(oidc_env, variables, error):
    for name, value in variables.items():
        oidc_env.setenv(f"MODELYARD_OIDC_{name}", value)
    with pytest.raises(ImproperlyConfigured) as raised:
        env_oidc()
    assert str(raised.value) == error


@pytest.mark.parametrize(
    ("more", "error"),
    [
        (
            {"ROLE_MAP": "ml-eng=maintainer,ml-release"},
            "MODELYARD_OIDC_ROLE_MAP: expected GROUP=ROLE pairs separated by commas "
            "(e.g. ml-release=approver,ml-eng=maintainer), got 'ml-release'",
        ),
        (
            {"ROLE_MAP": "=approver"},
            "MODELYARD_OIDC_ROLE_MAP: expected GROUP=ROLE pairs separated by commas "
            "(e.g. ml-release=approver,ml-eng=maintainer), got '=approver'",
        ),
        (
            {"ROLE_MAP": "ml-release=approvers"},
            "MODELYARD_OIDC_ROLE_MAP: unknown role 'approvers' for group 'ml-release'; "
            "roles are viewer, maintainer, approver, auditor, inference, admin",
        ),
        (
            {"ISSUER": "http://login.example.test"},
            "MODELYARD_OIDC_ISSUER: 'http://login.example.test' is plain HTTP to another host; an OpenID provider "
            "must be reached over https (http only on loopback, for testing)",
        ),
        (
            {"ISSUER": "login.example.test"},
            "MODELYARD_OIDC_ISSUER: expected the provider's issuer URL (https://..., as its discovery document "
            "gives it), got 'login.example.test'",
        ),
        ({"SCOPES": "email profile"}, "MODELYARD_OIDC_SCOPES: must include openid, got 'email profile'"),
        (
            {"REDIRECT_URI": "/accounts/oidc/callback/"},
            "MODELYARD_OIDC_REDIRECT_URI: expected an http(s) URL, got '/accounts/oidc/callback/'",
        ),
    ],
)
def test_a_bad_value_stops_the_start_naming_the_variable(oidc_env, more, error):
    complete(oidc_env, **more)
    with pytest.raises(ImproperlyConfigured) as raised:
        env_oidc()
    assert str(raised.value) == error


def _start(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        env=base_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_server_refuses_to_start_half_set_up_or_with_nobody_able_to_sign_in(tmp_path):
    half = _start(MODELYARD_DATA_DIR=str(tmp_path), MODELYARD_OIDC_CLIENT_ID="modelyard")
    assert half.returncode != 0
    assert "OpenID Connect is half set up: MODELYARD_OIDC_CLIENT_ID set but" in half.stderr
    locked_out = _start(MODELYARD_DATA_DIR=str(tmp_path), MODELYARD_PASSWORD_LOGIN="false")
    assert locked_out.returncode != 0
    assert "MODELYARD_PASSWORD_LOGIN=false with no OpenID Connect provider: nobody could sign in" in locked_out.stderr


# --- The sign-in service --------------------------------------------------------------------------------


@pytest.fixture
def configured(settings: Any) -> Any:
    settings.OIDC = CONFIG
    return settings


def claims(subject: str, **more: Any) -> dict[str, Any]:
    return {"iss": ISSUER, "sub": subject, "preferred_username": subject, "email": f"{subject}@example.test", **more}


ACTOR = Actor(ip="192.0.2.7", label="anonymous")


@pytest.mark.django_db
def test_the_first_sign_in_creates_the_user_and_each_change_of_roles_is_audited(configured):
    user = oidc.sign_in(claims=claims("s-1", preferred_username="ada"), groups=["ml-release", "ml-eng"], actor=ACTOR)
    assert (user.username, user.email, user.has_usable_password()) == ("ada", "s-1@example.test", False)
    assert set(user.groups.values_list("name", flat=True)) == {"approver", "maintainer"}
    created = AuditEvent.objects.get(action="user.create", target="ada")
    assert (created.actor, created.ip) == ("oidc", "192.0.2.7")
    grant = AuditEvent.objects.get(action="user.roles.grant", target="ada")
    assert grant.after == {"roles": ["approver", "maintainer"], "privileged": ["approver"]}

    # The provider renames the subject: the same account, found by (issuer, subject), keeps its name.
    again = oidc.sign_in(claims=claims("s-1", preferred_username="ada.l"), groups=["ml-eng"], actor=ACTOR)
    assert again.pk == user.pk and again.username == "ada"
    assert set(again.groups.values_list("name", flat=True)) == {"maintainer"}
    revoke = AuditEvent.objects.get(action="user.roles.revoke", target="ada")
    assert (revoke.actor, revoke.after) == ("oidc", {"roles": ["approver"]})
    assert OidcIdentity.objects.get().last_login_at is not None

    count = AuditEvent.objects.count()
    oidc.sign_in(claims=claims("s-1"), groups=["ml-eng"], actor=ACTOR)
    assert AuditEvent.objects.count() == count  # nothing changed, nothing recorded


@pytest.mark.django_db
def test_roles_the_map_does_not_name_stay_as_an_admin_set_them(configured):
    user = oidc.sign_in(claims=claims("s-2"), groups=[], actor=ACTOR)
    user.groups.add(Group.objects.get_or_create(name=Role.AUDITOR)[0])
    oidc.sign_in(claims=claims("s-2"), groups=["ml-eng"], actor=ACTOR)
    assert set(user.groups.values_list("name", flat=True)) == {"auditor", "maintainer"}


@pytest.mark.django_db
def test_a_first_sign_in_never_takes_over_an_account_of_the_same_name(configured):
    make_person("ada", Role.ADMIN)
    with pytest.raises(InvalidInput) as raised:
        oidc.sign_in(claims=claims("s-3", preferred_username="Ada"), groups=["ml-release"], actor=ACTOR)
    assert raised.value.message == (
        "the username 'Ada' belongs to another Modelyard account, which a sign-in with Acme SSO never takes "
        "over; ask an admin to rename or remove it"
    )
    assert not OidcIdentity.objects.exists()
    assert set(User.objects.get(username="ada").groups.values_list("name", flat=True)) == {"admin"}


@pytest.mark.django_db
def test_a_deactivated_user_is_refused_and_groups_must_be_names(configured):
    user = oidc.sign_in(claims=claims("s-4"), groups=["ml-eng"], actor=ACTOR)
    User.objects.filter(pk=user.pk).update(is_active=False)
    with pytest.raises(PermissionDenied) as raised:
        oidc.sign_in(claims=claims("s-4"), groups=["ml-release"], actor=ACTOR)
    assert raised.value.message == "the account 's-4' is deactivated; ask an admin"
    assert set(user.groups.values_list("name", flat=True)) == {"maintainer"}
    with pytest.raises(InvalidInput) as bad:
        oidc.groups_of({"groups": [{"id": 1}]}, "groups")
    assert bad.value.message == "the provider's 'groups' claim is not a list of group names"
    assert oidc.groups_of({"groups": "ml-eng"}, "groups") == ["ml-eng"]
    assert oidc.groups_of({}, "groups") == []


# --- The login page -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_login_page_offers_the_provider_only_when_configured(settings):
    page = Client().get("/accounts/login/?next=/ui/models/demo")
    assert b"Sign in with" not in page.content and b'id="id_password"' in page.content
    assert Client().get("/accounts/oidc/login/").status_code == 404
    assert Client().get("/accounts/oidc/callback/?code=x&state=y").status_code == 404
    settings.OIDC = CONFIG
    page = Client().get("/accounts/login/?next=/ui/models/demo")
    assert b'href="/accounts/oidc/login/?next=/ui/models/demo">Sign in with Acme SSO</a>' in page.content
    assert b'id="id_password"' in page.content


@pytest.mark.django_db
def test_with_password_sign_in_off_the_form_is_gone_and_a_password_is_refused_everywhere(settings):
    login_person("ada", Role.ADMIN)
    User.objects.filter(username="ada").update(is_staff=True, is_superuser=True)
    settings.OIDC = CONFIG
    settings.PASSWORD_LOGIN = False
    page = Client().get("/accounts/login/")
    assert b'id="id_password"' not in page.content and b"Password sign-in is turned off here." in page.content

    client = Client()
    refused = client.post("/accounts/login/", {"username": "ada", "password": PASSWORD}, follow=False)
    assert refused.status_code == 403
    assert "Password sign-in is turned off here: sign in with Acme SSO." in refused.content.decode()
    assert client.get("/ui/").status_code == 302  # not signed in
    admin = Client()
    answer = admin.post("/admin/login/?next=/admin/", {"username": "ada", "password": PASSWORD, "next": "/admin/"})
    assert answer.status_code == 200  # the form again: the backend checks no password
    assert "_auth_user_id" not in admin.session

    settings.PASSWORD_LOGIN = True
    signed_in = Client()
    assert signed_in.post("/accounts/login/", {"username": "ada", "password": PASSWORD}).status_code == 302
    assert "_auth_user_id" in signed_in.session
