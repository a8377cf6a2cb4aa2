"""Sign-in with a real OpenID provider in Chromium: login, roles from groups, a group taken away, bad tokens refused.

The provider is node's oidc-provider on loopback (tests/support/oidc_provider.py); the registry is a
real ``modelyard serve --role web`` configured only through its MODELYARD_OIDC_* variables, with
password sign-in turned off. The browser does what a person does: clicks "Sign in with Acme SSO",
signs in at the provider, and lands back in the registry (or on the login page, refused).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from playwright.sync_api import expect

from registry.access import services
from registry.models import AuditEvent, OidcIdentity, Role
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, OTHER_CLIENT_ID, OidcProvider
from tests.support.processes import ServeProcess, base_env, free_port, subprocess_database_url
from tests.support.ui import LAPTOP, csp_violations, person, shoot, watch_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

User = get_user_model()
PROVIDER_NAME = "Acme SSO"
ROLE_MAP = "ml-release=approver,ml-eng=maintainer,ml-eng=viewer"


class World:
    def __init__(self, provider: OidcProvider, server: ServeProcess) -> None:
        self.provider = provider
        self.server = server
        self.base = server.base


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("oidc")
    provider_port = free_port()
    env = base_env(
        MODELYARD_DATABASE_URL=subprocess_database_url(),
        MODELYARD_STORAGE_URL=(folder / "artifacts").as_uri(),
        MODELYARD_DATA_DIR=str(folder / "data"),
        MODELYARD_SECRET_KEY=secrets.token_urlsafe(48),
        MODELYARD_OIDC_ISSUER=f"http://127.0.0.1:{provider_port}",
        MODELYARD_OIDC_CLIENT_ID=CLIENT_ID,
        MODELYARD_OIDC_CLIENT_SECRET=CLIENT_SECRET,
        MODELYARD_OIDC_PROVIDER_NAME=PROVIDER_NAME,
        MODELYARD_OIDC_SCOPES="openid email profile groups",
        MODELYARD_OIDC_ROLE_MAP=ROLE_MAP,
        MODELYARD_PASSWORD_LOGIN="false",
    )
    server = ServeProcess("oidc-web", "web", env, folder / "serve.log")
    provider = None
    try:
        provider = OidcProvider(folder, f"{server.base}/accounts/oidc/callback/", port=provider_port)
        server.wait_ready(timeout=120)
        yield World(provider, server)
    finally:
        server.kill()
        if provider is not None:
            provider.stop()
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(autouse=True)
def _untampered(world: World) -> Iterator[None]:
    world.provider.tamper()
    yield
    world.provider.tamper()


def sign_in(browser: Any, world: World, subject: str, start: str = "/ui/") -> Any:
    """A fresh browser (no session at the provider either) through the whole flow; returns its page where it ended."""
    context = browser.new_context(viewport=LAPTOP)
    context.set_default_timeout(20_000)
    page = context.new_page()
    watch_console(page)
    page.authorizations = []  # the authorization requests the registry sent the browser with
    page.on(
        "request",
        lambda r: page.authorizations.append(r.url) if r.url.startswith(world.provider.issuer + "/auth") else None,
    )
    page.goto(f"{world.base}{start}")
    page.wait_for_url(f"{world.base}/accounts/login/?next={start}")
    expect(page.locator("#id_password")).to_have_count(0)  # password sign-in is off here
    expect(page.locator("#password-login-off")).to_be_visible()
    page.click(f"a:has-text('Sign in with {PROVIDER_NAME}')")
    page.wait_for_url(f"{world.provider.issuer}/interaction/**")
    page.fill("input[name=login]", subject)
    page.fill("input[name=password]", "any password: the provider's development login takes any")
    page.click("button:has-text('Sign-in')")
    page.wait_for_url(f"{world.base}/**")
    page.wait_for_load_state()
    return page


def roles_of(username: str) -> set[str]:
    return set(User.objects.get(username=username).groups.values_list("name", flat=True))


def events(action: str, target: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, target=target).order_by("seq"))


def test_login_maps_groups_to_roles_and_a_group_taken_away_takes_its_role_at_the_next_login(browser, world):
    world.provider.set_groups("alice", "ml-eng", "ml-release", "canteen")

    page = sign_in(browser, world, "alice", start="/ui/tokens")
    page.wait_for_url(f"{world.base}/ui/tokens")  # where the sign-in started
    expect(page.locator("header")).to_contain_text("alice")
    shoot(page, "oidc-signed-in")
    assert csp_violations(page) == []
    # The authorization code flow with PKCE: S256, a state and a nonce on the way out.
    authorization = page.authorizations[0]
    for part in (f"client_id={CLIENT_ID}", "response_type=code", "code_challenge=", "code_challenge_method=S256"):
        assert part in authorization
    assert "state=" in authorization and "nonce=" in authorization

    assert roles_of("alice") == {Role.APPROVER, Role.MAINTAINER, Role.VIEWER}
    identity = OidcIdentity.objects.get()
    assert (identity.issuer, identity.subject, identity.user.username) == (world.provider.issuer, "alice", "alice")
    assert not identity.user.has_usable_password()
    (created,) = events("user.create", "alice")
    assert created.actor == "oidc" and created.after["roles"] == []
    (granted,) = events("user.roles.grant", "alice")
    assert granted.actor == "oidc"
    assert granted.after == {"roles": ["approver", "maintainer", "viewer"], "privileged": ["approver"]}
    page.context.close()

    # An admin gives alice a role the map does not name: the provider's groups leave it alone.
    services.user_update_access(username="alice", roles=[*roles_of("alice"), Role.AUDITOR], actor=admin_actor())

    world.provider.set_groups("alice", "ml-eng")  # taken out of ml-release at the provider
    page = sign_in(browser, world, "alice")
    page.wait_for_url(f"{world.base}/ui/")
    assert roles_of("alice") == {Role.MAINTAINER, Role.VIEWER, Role.AUDITOR}
    (revoked,) = events("user.roles.revoke", "alice")
    assert (revoked.actor, revoked.after) == ("oidc", {"roles": ["approver"]})
    assert User.objects.filter(username="alice").count() == 1 and OidcIdentity.objects.count() == 1
    page.context.close()

    # The same groups again: nothing changes, so nothing is recorded.
    before = AuditEvent.objects.filter(target="alice").count()
    page = sign_in(browser, world, "alice")
    page.wait_for_url(f"{world.base}/ui/")
    assert AuditEvent.objects.filter(target="alice").count() == before
    page.context.close()


def admin_actor() -> Any:
    return person("root-admin", Role.ADMIN)


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (
            {"aud": OTHER_CLIENT_ID},
            "the provider's ID token was issued for another application (its audience is not this client)",
        ),
        ({"expired": True}, "the provider's ID token has expired"),
    ],
    ids=["wrong-audience", "expired"],
)
def test_an_id_token_for_another_client_or_expired_is_refused_and_signs_nobody_in(browser, world, tamper, reason):
    world.provider.set_groups("mallory", "ml-release")
    world.provider.tamper(**tamper)

    page = sign_in(browser, world, "mallory")
    page.wait_for_url(f"{world.base}/accounts/login/")
    expect(page.locator(".flash.error")).to_have_text(f"Sign-in with {PROVIDER_NAME} was refused: {reason}.")
    expect(page.locator("header")).not_to_contain_text("mallory")
    shoot(page, f"oidc-refused-{next(iter(tamper))}")
    page.goto(f"{world.base}/ui/")  # still signed out
    page.wait_for_url(f"{world.base}/accounts/login/?next=/ui/")
    page.context.close()

    assert not User.objects.filter(username="mallory").exists()
    assert not OidcIdentity.objects.exists()
    (refused,) = AuditEvent.objects.filter(action="auth.oidc.refused")
    assert (refused.actor, refused.target, refused.after) == ("anonymous", world.provider.issuer, {"reason": reason})
    assert not AuditEvent.objects.filter(action__startswith="user.").exists()


def test_a_callback_the_registry_did_not_start_or_an_error_from_the_provider_is_refused(browser, world):
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.goto(f"{world.base}/accounts/oidc/callback/?code=forged&state=forged")
    page.wait_for_url(f"{world.base}/accounts/login/")
    expect(page.locator(".flash.error")).to_have_text(
        f"Sign-in with {PROVIDER_NAME} was refused: the sign-in expired or was started in another browser; "
        "start it again."
    )
    page.goto(f"{world.base}/accounts/oidc/callback/?error=access_denied&error_description=not+assigned")
    page.wait_for_url(f"{world.base}/accounts/login/")
    expect(page.locator(".flash.error")).to_have_text(
        f"Sign-in with {PROVIDER_NAME} was refused: the provider answered access_denied: not assigned."
    )
    context.close()
    reasons = list(
        AuditEvent.objects.filter(action="auth.oidc.refused").order_by("seq").values_list("after", flat=True)
    )
    assert reasons == [
        {"reason": "the sign-in expired or was started in another browser; start it again"},
        {"reason": "the provider answered access_denied: not assigned"},
    ]
    assert not User.objects.exists()
