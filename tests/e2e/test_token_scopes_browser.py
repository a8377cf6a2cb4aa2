"""In Chromium: a token limited to some roles and models from the tokens page, its rotation, and a service
account refused at the login form."""

from __future__ import annotations

import pytest
import requests
from playwright.sync_api import expect

from registry.access import services
from registry.access.lockout import SERVICE_ACCOUNT_LOGIN
from registry.audit.chain import SYSTEM
from registry.models import ApiToken, AuditEvent, Role
from tests.support.ui import LAPTOP, login, person, shoot

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_limited_token_is_made_and_rotated_on_the_tokens_page(server, browser):
    person("pia", Role.MAINTAINER, Role.INFERENCE)
    page = login(browser, server.url, "pia")
    page.goto(f"{server.url}/ui/tokens")
    page.fill("#id_name", "scorer")
    page.fill("#id_models", "fraud-*")
    page.locator("#create-token input[name=roles][value=inference]").check()
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#token-secret").inner_text().strip()
    prefix = secret.split("_")[1]
    row = page.locator(f"tr[data-token='{prefix}']")
    expect(row.locator("td.roles")).to_have_text("inference")
    expect(row.locator("td.models")).to_have_text("fraud-*")
    shoot(page, "tokens-limited")
    # It carries inference only: creating a model, which the user may do, is refused for the token.
    api = f"{server.url}/api/v1"
    headers = {"Authorization": f"Bearer {secret}"}
    refused = requests.post(f"{api}/models", json={"name": "fraud-new"}, headers=headers, timeout=30)
    assert (refused.status_code, refused.json()["error"]) == (403, "this action needs the maintainer or admin role")
    assert requests.get(f"{api}/me", headers=headers, timeout=30).json()["roles"] == ["inference"]

    # Rotate with a one-hour overlap: a new secret is shown once; both work meanwhile.
    row.locator("input[name=overlap_hours]").fill("1")
    row.get_by_role("button", name="Rotate").click()
    fresh = page.locator("#token-secret").inner_text().strip()
    assert fresh != secret
    expect(page.locator("#new-token")).to_contain_text(f"It replaces token {prefix}, which works until")
    for raw in (secret, fresh):
        assert requests.get(f"{api}/me", headers={"Authorization": f"Bearer {raw}"}, timeout=30).status_code == 200
    new = ApiToken.objects.get(prefix=fresh.split("_")[1])
    assert (new.roles, new.model_patterns, new.rotated_from.prefix if new.rotated_from else None) == (
        ["inference"],
        ["fraud-*"],
        prefix,
    )
    assert AuditEvent.objects.get(action="token.rotate", target=prefix).actor == "pia"
    page.context.close()


def test_a_service_account_is_told_it_cannot_sign_in(server, browser):
    person("boss", Role.ADMIN)
    services.service_account_create(username="etl", owner="boss", roles=[Role.INFERENCE], actor=SYSTEM)
    ctx = browser.new_context(viewport=LAPTOP)
    page = ctx.new_page()
    page.goto(f"{server.url}/accounts/login/")
    page.fill("#id_username", "etl")
    page.fill("#id_password", "whatever it may be")
    page.click("button[type=submit]:has-text('Log in')")
    expect(page.locator("#service-account")).to_have_text(SERVICE_ACCOUNT_LOGIN.format(username="etl"))
    assert page.url.endswith("/accounts/login/")
    ctx.close()
