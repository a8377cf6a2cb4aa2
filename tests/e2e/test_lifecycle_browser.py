"""Deleting a version in real Chromium: the admin opens it, asks to delete it, reads what goes, gives a reason,
confirms, and lands on its tombstone; the bytes are gone from the store. The lifecycle pages fit a phone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry.lifecycle import retention
from registry.lifecycle import services as lifecycle
from registry.models import AuditEvent, ModelVersion, RegisteredModel, Role
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.people import PASSWORD, login_person
from tests.support.registry import artifact_path, create_model, upload_versions
from tests.support.ui import LAPTOP, PHONE, csp_violations, watch_console

# Chromium is required by tests/e2e/conftest.py: skipped without it locally, a failure in CI.
pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_deletes_a_version_after_reading_what_goes(live_server, tmp_path):
    from playwright.sync_api import ViewportSize, expect, sync_playwright

    # All database work happens outside the Playwright block: its event loop makes Django refuse sync queries.
    owner = login_person("owner", Role.MAINTAINER)
    root = login_person("root", Role.ADMIN)
    create_model(owner)
    v1, v2, _ = upload_versions(owner, [1.0, 2.0, 3.0])
    # Something on each page: a held and archived version, and a rule whose plan lists versions.
    lifecycle.version_hold(version=v2, actor=root.actor, reason="case 2026-17, kept for the regulator's review")
    lifecycle.version_archive(version=v2, actor=owner.actor)
    ModelVersion.objects.filter(pk__in=[v1.pk, v2.pk]).update(created_at=timezone.now() - timedelta(days=40))
    rule = {"keep_last": 1, "keep_days": 30, "then": "delete"}
    retention.retention_set(model=RegisteredModel.objects.get(name="demo"), rule=rule, actor=root.actor)
    phone_pages = [
        "/ui/models/demo?lifecycle=all",
        "/ui/models/demo/versions/1",
        "/ui/models/demo/versions/2",
        "/ui/models/demo/versions/1/delete",
        "/ui/models/demo/versions/2/delete",
        "/ui/models/demo/retention",
    ]
    (model_file,) = v1.files.all()
    stored = artifact_path(v1)
    assert stored.exists()
    base = live_server.url

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            watch_console(page)
            page.goto(f"{base}/ui/models/demo/versions/1")
            page.fill("#id_username", "root")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]:has-text('Log in')")
            expect(page).to_have_url(f"{base}/ui/models/demo/versions/1")
            expect(page.locator("#lifecycle")).to_contain_text("active")
            page.set_viewport_size(ViewportSize(width=PHONE["width"], height=PHONE["height"]))
            wide = {}
            for path in phone_pages:
                page.goto(f"{base}{path}")
                scroll = page.evaluate("document.documentElement.scrollWidth")
                if scroll > PHONE["width"]:
                    wide[path] = scroll
            assert wide == {}, f"pages wider than {PHONE['width']} px: {wide}"
            page.set_viewport_size(ViewportSize(width=LAPTOP["width"], height=LAPTOP["height"]))
            page.goto(f"{base}/ui/models/demo/versions/1")

            page.get_by_role("link", name="Delete version 1…").click()
            expect(page).to_have_url(f"{base}/ui/models/demo/versions/1/delete")
            files = page.locator("#delete-files")
            expect(files.locator(f"tr[data-file='{model_file.name}']")).to_contain_text(model_file.sha256)
            expect(files.locator(f"tr[data-file='{model_file.name}']")).to_contain_text(
                f"({model_file.size_bytes} bytes)"
            )
            expect(files.locator("tr[data-signature='registry']")).to_be_visible()
            expect(page.locator("#delete-what")).to_contain_text("tombstone")
            page.screenshot(path=str(tmp_path / "ui-version-delete.png"), full_page=True)

            page.locator("#delete-reason").fill("superseded by v2")
            page.get_by_role("button", name="Delete version 1").click()

            expect(page).to_have_url(f"{base}/ui/models/demo/versions/1")
            expect(page.get_by_role("status")).to_contain_text("Version 1 deleted.")
            expect(page.locator("#tombstone")).to_contain_text("This version is a tombstone.")
            expect(page.locator("#tombstone")).to_contain_text("superseded by v2")
            expect(page.locator("#purge")).to_contain_text("were removed from the store")
            expect(page.locator("#files a[download]")).to_have_count(0)
            page.screenshot(path=str(tmp_path / "ui-tombstone.png"), full_page=True)
            assert csp_violations(page) == []
        finally:
            browser.close()

    tombstone = ModelVersion.objects.get(model__name="demo", version=1)
    assert (tombstone.deleted_by.username, tombstone.delete_reason) == ("root", "superseded by v2")
    assert tombstone.purged_at is not None and not stored.exists()
    assert AuditEvent.objects.filter(action="version.delete", actor="root", target="demo/1").exists()
