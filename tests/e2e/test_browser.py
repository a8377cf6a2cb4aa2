"""The UI in real Chromium: an approver logs in, approves another person's promotion, and checks the audit log."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from registry.models import Alias, AuditEvent, PromotionRequest, Role
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.people import PASSWORD, login_person
from tests.support.registry import pending_promotion

LEAD_SCREENSHOT = Path("/tmp/ui-promotions.png")

# Chromium is required by tests/e2e/conftest.py: skipped without it locally, a failure in CI.
pytestmark = pytest.mark.django_db(transaction=True)


def test_approver_approves_in_the_browser_and_sees_it_audited(live_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    # All database work happens outside the Playwright block: its event loop makes Django refuse sync queries.
    promotion = pending_promotion(login_person("requester", Role.MAINTAINER))
    login_person("lead", Role.APPROVER, Role.AUDITOR)
    shot = tmp_path / "ui-promotions.png"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/ui/promotions")
            expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/ui/promotions")
            page.fill("#id_username", "lead")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]:has-text('Log in')")
            expect(page).to_have_url(f"{live_server.url}/ui/promotions")

            row = page.locator(f"#pending tr[data-promotion='{promotion.pk}']")
            expect(row).to_contain_text("requester")
            expect(row).to_contain_text("production")
            # The decision is made on the request's review page, and confirmed in a dialog.
            row.get_by_role("link", name="Review").click()
            expect(page).to_have_url(f"{live_server.url}/ui/promotions/{promotion.pk}")
            page.locator("#id_reason").fill("ship it")
            page.get_by_role("button", name="Approve").click()
            page.locator("dialog#confirm").get_by_role("button", name="Approve").click()
            expect(page.get_by_role("status")).to_have_text(f"Promotion request {promotion.pk} approved.")
            expect(page.locator("#pending")).to_contain_text("Nothing is waiting for review.")
            expect(page.locator(f"#decided tr[data-promotion='{promotion.pk}']")).to_contain_text("approved")
            page.screenshot(path=str(shot), full_page=True)

            page.get_by_role("link", name="Audit").click()
            page.fill("input[name=action]", "promotion.")
            page.get_by_role("button", name="Verify chain").click()
            expect(page.locator("#events tbody tr").first).to_contain_text("promotion.approve")
            expect(page.locator("#events tbody tr").first).to_contain_text("lead")
            expect(page.locator("#verify-result")).to_contain_text("chain ok")
            page.screenshot(path=str(tmp_path / "ui-audit.png"), full_page=True)
        finally:
            browser.close()

    shutil.copyfile(shot, LEAD_SCREENSHOT)
    promotion.refresh_from_db()
    assert (promotion.state, promotion.decided_by.username, promotion.decision_reason) == (
        "approved",
        "lead",
        "ship it",
    )
    assert Alias.objects.get(model__name="demo", name="production").version.version == 1
    assert AuditEvent.objects.filter(action="promotion.approve", actor="lead", target=str(promotion.pk)).exists()
    assert not PromotionRequest.objects.filter(state="pending").exists()


def test_the_login_lockout_says_until_when_in_the_viewers_time_zone(live_server, settings):
    from zoneinfo import ZoneInfo

    from django.test import Client
    from playwright.sync_api import expect, sync_playwright

    from registry.models import LoginFailure

    settings.LOGIN_MAX_FAILURES = 2
    login_person("lou", Role.VIEWER)
    for _ in range(2):
        Client().post("/accounts/login/", {"username": "lou", "password": "wrong"})
    until = LoginFailure.objects.get(kind="user", value="lou").locked_until
    zone = "Asia/Kolkata"  # UTC+5:30, so neither hour nor minute matches UTC
    local = until.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(timezone_id=zone)
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/accounts/login/")
            page.fill("#id_username", "lou")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]:has-text('Log in')")
            message = page.locator("#locked-out")
            expect(message).to_contain_text("Too many failed logins for 'lou': logging in is locked for")
            expect(message.locator("time")).to_contain_text(local)
            text = message.inner_text()
        finally:
            browser.close()
    assert "UTC" not in text and ("IST" in text or "GMT+5:30" in text), text
