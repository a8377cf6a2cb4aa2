"""``GET /api/v1/me``: who the caller is, with which roles and which token (never its secret)."""

from __future__ import annotations

import pytest

from registry.models import ApiToken, Role
from tests.support.people import login_person, make_person

pytestmark = pytest.mark.django_db


def test_a_token_names_its_user_roles_and_itself():
    erin = make_person("erin", Role.MAINTAINER, Role.AUDITOR)
    response = erin.get("/api/v1/me")
    assert response.status_code == 200
    body = response.json()
    prefix = ApiToken.objects.get(user__username="erin").prefix
    assert (body["username"], body["roles"], body["token"]["prefix"]) == ("erin", ["auditor", "maintainer"], prefix)
    assert erin.token not in response.content.decode()


def test_a_browser_session_has_no_token():
    frank = login_person("frank", Role.VIEWER)
    body = frank.client.get("/api/v1/me").json()
    assert body == {"username": "frank", "roles": ["viewer"], "token": None}


def test_anonymous_callers_are_401(client):
    response = client.get("/api/v1/me")
    assert response.status_code == 401
    assert response.json()["error"] == "authentication required: send 'Authorization: Bearer <token>'"
