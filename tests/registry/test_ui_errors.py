"""The UI's frame: HTML error pages under /ui/ and /accounts/ (JSON elsewhere), links by role, a strict CSP."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from registry.models import AuditEvent, Role
from tests.support.people import login_person
from tests.support.registry import pending_promotion

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer():
    return login_person("vic", Role.VIEWER)


def test_unknown_pages_under_the_ui_are_html_404s(viewer):
    for path in ("/ui/models/nope", "/ui/models/nope/versions/1", "/ui/no-such-page", "/accounts/nope/"):
        response = viewer.client.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "text/html; charset=utf-8", path
        assert f"There is nothing at {path}".encode() in response.content, path
        assert b'href="/ui/"' in response.content  # a way back


def test_unknown_version_of_a_known_model_is_an_html_404(viewer):
    pending_promotion(login_person("mia", Role.MAINTAINER))
    response = viewer.client.get("/ui/models/demo/versions/9")
    assert response.status_code == 404
    assert b"<h1>Not found" in response.content


def test_the_api_keeps_json_404s(viewer):
    response = viewer.get("/api/v1/models/nope")
    assert response.status_code == 404
    assert response.json()["error"]
    assert Client().get("/nothing-here").json() == {"error": "not found", "detail": "/nothing-here"}


def test_get_on_a_form_address_is_an_html_405_naming_the_method(viewer):
    promotion = pending_promotion(login_person("mia", Role.MAINTAINER))
    for path, allowed in (
        (f"/ui/promotions/{promotion.pk}/approve", "POST"),
        ("/ui/models/demo/aliases/production/rollback", "POST"),
        ("/ui/tokens/abc/revoke", "POST"),
        ("/accounts/logout/", "POST, OPTIONS"),
    ):
        response = viewer.client.get(path)
        assert response.status_code == 405, path
        assert response["Allow"] == allowed
        assert response["Content-Type"] == "text/html; charset=utf-8"
        assert f"{path} does not answer GET; it takes {allowed}.".encode() in response.content
        assert b"use the form on its page" in response.content


def test_a_form_that_fails_the_csrf_check_gets_the_ui_403_page(viewer):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(get_user_model().objects.get(username="vic"))
    response = strict.post("/ui/tokens", {"name": "x"})
    assert response.status_code == 403
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert b"Form expired" in response.content and b"CSRF cookie not set" in response.content


def test_a_server_error_in_the_ui_is_an_html_500(viewer, monkeypatch):
    from registry.ui import views as ui_views

    def broken(**kwargs):
        raise RuntimeError("the database fell over")

    monkeypatch.setattr(ui_views.selectors, "model_list_with_versions", broken)
    client = viewer.client
    client.raise_request_exception = False
    response = client.get("/ui/")
    assert response.status_code == 500
    assert b"The server failed to answer" in response.content
    assert b"the database fell over" not in response.content


def test_navigation_links_only_to_what_the_roles_allow():
    pages = {
        "viewer": login_person("vic", Role.VIEWER).client.get("/ui/").content,
        "auditor": login_person("aud", Role.AUDITOR).client.get("/ui/").content,
        "admin": login_person("ada", Role.ADMIN).client.get("/ui/").content,
    }
    assert b'href="/ui/audit"' not in pages["viewer"] and b'href="/ui/users"' not in pages["viewer"]
    assert b'href="/ui/audit"' in pages["auditor"] and b'href="/ui/users"' not in pages["auditor"]
    assert b'href="/ui/audit"' in pages["admin"] and b'href="/ui/users"' in pages["admin"]
    for content in pages.values():
        assert b'href="/ui/tokens"' in content and b'href="/accounts/password_change/"' in content


PAGES = [
    "/",
    "/accounts/login/",
    "/ui/",
    "/ui/models/demo",
    "/ui/models/demo/versions/1",
    "/ui/models/demo/upload",
    "/ui/models/demo/compare?a=1&b=2",
    "/ui/models/demo/promote",
    "/ui/promotions",
    "/ui/audit",
    "/ui/fleet",
    "/ui/tokens",
    "/ui/users",
    "/accounts/password_change/",
    "/ui/models/nope",
]


def test_every_page_has_a_viewport_a_strict_csp_and_no_inline_code():
    admin = login_person("ada", Role.ADMIN)
    promotion = pending_promotion(admin)
    for path in [*PAGES, f"/ui/promotions/{promotion.pk}"]:
        client = Client() if path in ("/", "/accounts/login/") else admin.client
        response = client.get(path)
        assert response.status_code in (200, 404), path
        html = response.content.decode()
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe" not in policy, path
        assert "frame-ancestors 'none'" in policy and "form-action 'self'" in policy
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html, path
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), f"inline script on {path}"
        assert not re.search(r"<style\b", html), f"inline <style> on {path}"
        assert not re.search(r"\sstyle=", html), f"style attribute on {path}"
        assert not re.search(r"\son[a-z]+=", html), f"inline event handler on {path}"
        assert '<script type="module" src="/static/modelyard/ui.js">' in html, path


def test_the_static_files_are_served_from_this_origin(viewer):
    for path in ("/static/modelyard/ui.css", "/static/modelyard/ui.js"):
        response = viewer.client.get(path)
        assert response.status_code == 200, path
        assert b"".join(response.streaming_content)


def test_every_form_posts_with_a_csrf_token():
    admin = login_person("ada", Role.ADMIN)
    promotion = pending_promotion(admin)
    admin.client.get("/ui/tokens")
    for path in [*PAGES, f"/ui/promotions/{promotion.pk}"]:
        html = admin.client.get(path).content.decode()
        for form in re.findall(r"<form\b[^>]*>.*?</form>", html, flags=re.S):
            if re.search(r'method="post"', form):
                assert "csrfmiddlewaretoken" in form, f"{path}: {form[:200]}"


def test_the_users_page_refusal_is_html_and_audited(viewer):
    response = viewer.client.get("/ui/users")
    assert response.status_code == 403
    assert b"Managing users and roles needs the admin role." in response.content
    denied = AuditEvent.objects.get(action="access.denied")
    assert (denied.actor, denied.target) == ("vic", "GET /ui/users")
