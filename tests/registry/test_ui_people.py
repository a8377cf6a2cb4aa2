"""Tokens, users and roles, and passwords in the UI: through the audited services, refused without the role."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from registry.models import ApiToken, AuditEvent, Role
from tests.support.people import PASSWORD, login_person, make_person

pytestmark = pytest.mark.django_db

User = get_user_model()
NEW_PASSWORD = "a much longer passphrase 42"


@pytest.fixture
def admin():
    return login_person("ada", Role.ADMIN)


@pytest.fixture
def viewer():
    return login_person("vic", Role.VIEWER)


def after(action: str, target: str) -> dict:
    return AuditEvent.objects.filter(action=action, target=target).latest("seq").after


# --- Tokens -------------------------------------------------------------------------------------------


def test_a_token_is_created_shown_once_used_and_revoked(viewer):
    response = viewer.client.post("/ui/tokens", {"name": "ci", "expires_days": "30"})
    assert response.status_code == 200
    secret = re.search(rb'id="token-secret">(my_[^<]+)<', response.content).group(1).decode()
    token = ApiToken.objects.get(name="ci")
    assert token.user.username == "vic" and token.expires_at is not None
    assert after("token.create", token.prefix)["name"] == "ci"
    assert Client().get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
    listed = viewer.client.get("/ui/tokens")
    assert secret.encode() not in listed.content  # shown once
    assert token.prefix.encode() in listed.content

    revoked = viewer.client.post(f"/ui/tokens/{token.prefix}/revoke")
    assert (revoked.status_code, revoked["Location"]) == (302, "/ui/tokens")
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoke", target=token.prefix, actor="vic").exists()
    refused = Client().get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert refused.status_code == 401


def test_someone_elses_token_is_not_found_for_a_non_admin_and_revocable_by_an_admin(viewer, admin):
    other = login_person("oscar", Role.VIEWER)
    token = ApiToken.objects.get(user__username="oscar")
    assert token.prefix.encode() not in viewer.client.get("/ui/tokens").content
    response = viewer.client.post(f"/ui/tokens/{token.prefix}/revoke")
    assert (response.status_code, response.context["error"]) == (404, f"no API token with prefix '{token.prefix}'")
    token.refresh_from_db()
    assert token.revoked_at is None
    page = admin.client.get("/ui/tokens")
    assert token.prefix.encode() in page.content and b"oscar" in page.content
    assert admin.client.post(f"/ui/tokens/{token.prefix}/revoke").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.get(action="token.revoke", target=token.prefix).actor == "ada"
    assert other.username == "oscar"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"expires_days": "0"}, "expires_days: Ensure this value is greater than or equal to 1."),
        ({"expires_days": "9999"}, "expires_days: Ensure this value is less than or equal to 3650."),
        ({"name": "n" * 101}, "name: Ensure this value has at most 100 characters (it has 101)."),
    ],
)
def test_bad_token_forms_are_400(viewer, data, error):
    response = viewer.client.post("/ui/tokens", data)
    assert (response.status_code, response.context["error"]) == (400, error)
    assert ApiToken.objects.filter(user__username="vic").count() == 1  # the fixture's own


# --- Users and roles ----------------------------------------------------------------------------------


def test_non_admins_neither_see_nor_change_users_and_the_refusals_are_audited(viewer):
    maintainer = login_person("mia", Role.MAINTAINER)
    assert maintainer.client.get("/ui/users").status_code == 403
    for path, data in (
        ("/ui/users", {"username": "mallory", "roles": ["admin"]}),
        ("/ui/users/vic", {"roles": ["admin"], "is_active": "on"}),
        ("/ui/users/vic/password-link", {}),
    ):
        response = maintainer.client.post(path, data)
        assert response.status_code == 403, path
    assert not User.objects.filter(username="mallory").exists()
    assert not User.objects.get(username="vic").groups.filter(name="admin").exists()
    assert list(AuditEvent.objects.filter(action="access.denied").values_list("after__reason", flat=True)) == [
        "managing users and roles needs the admin role",
        "inviting a user needs the admin role",
        "changing a user's roles needs the admin role",
        "making a set-password link needs the admin role",
    ]


def test_admin_invites_a_user_with_a_password_and_it_is_audited_like_the_admin_site(admin):
    response = admin.client.post(
        "/ui/users", {"username": "nina", "roles": ["maintainer", "auditor"], "password": NEW_PASSWORD}
    )
    assert (response.status_code, response["Location"]) == (302, "/ui/users")
    nina = User.objects.get(username="nina")
    assert nina.check_password(NEW_PASSWORD)
    assert sorted(nina.groups.values_list("name", flat=True)) == ["auditor", "maintainer"]
    event = AuditEvent.objects.get(action="user.create", target="nina")
    assert event.actor == "ada"
    assert event.after == {
        "username": "nina",
        "is_active": True,
        "is_staff": False,
        "is_superuser": False,
        "roles": ["auditor", "maintainer"],
        "groups": [],
        "permissions": [],
        "usable_password": True,
    }
    assert Client().post("/accounts/login/", {"username": "nina", "password": NEW_PASSWORD}).status_code == 302


def test_admin_invites_without_a_password_and_hands_over_a_set_password_link(admin):
    response = admin.client.post("/ui/users", {"username": "otto", "roles": ["viewer"]})
    assert response.status_code == 200
    link = response.context["link"]
    assert link[0] == "otto" and link[1].startswith("http://testserver/accounts/reset/")
    assert after("user.create", "otto")["usable_password"] is False
    assert "valid_seconds" in after("user.password.link", "otto")
    path = link[1].removeprefix("http://testserver")
    stranger = Client()
    form = stranger.get(path, follow=True)  # Django moves the token out of the URL into the session
    assert form.status_code == 200 and form.context["validlink"]
    done = stranger.post(form.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert (done.status_code, done["Location"]) == (302, "/accounts/login/")
    assert User.objects.get(username="otto").check_password(NEW_PASSWORD)
    change = AuditEvent.objects.get(action="user.password.change", target="otto")
    assert (change.actor, change.after) == ("otto", {"usable": True})
    again = Client().get(path, follow=True)
    assert again.context["validlink"] is False  # used once


@pytest.mark.parametrize(
    ("data", "status", "error"),
    [
        ({"username": "ada"}, 409, "a user named 'ada' already exists"),
        ({"username": "\uff41\uff44\uff41"}, 409, "a user named 'ada' already exists"),  # fullwidth: NFKC makes it ada
        ({"username": "ADA"}, 400, "username: 'ADA' differs from the existing user 'ada' only in case"),
        (
            {"username": "\u0430da"},  # a Cyrillic a, then Latin
            400,
            "username: '\u0430da' mixes letters of different scripts (cyrillic, latin), which lets a name pass for "
            "another's; use one script",
        ),
        ({"username": "bad name!"}, 400, "username: Enter a valid username."),
        ({"username": "p", "password": "short"}, 400, "password: This password is too short."),
        (
            {"username": "q", "roles": ["wizard"]},
            400,
            "roles: Select a valid choice. wizard is not one of the available choices.",
        ),
    ],
)
def test_bad_invitations_are_refused_with_the_message(admin, data, status, error):
    response = admin.client.post("/ui/users", data)
    assert response.status_code == status
    assert response.context["error"].startswith(error)
    assert not AuditEvent.objects.filter(action="user.create", actor="ada").exists()


def test_admin_grants_and_revokes_roles_and_deactivates(admin, viewer):
    response = admin.client.post("/ui/users/vic", {"roles": ["maintainer", "approver"], "is_active": "on"})
    assert (response.status_code, response["Location"]) == (302, "/ui/users")
    vic = User.objects.get(username="vic")
    assert sorted(vic.groups.values_list("name", flat=True)) == ["approver", "maintainer"]
    # Approver (and admin) are the roles that decide promotions: their grant says so.
    assert after("user.roles.grant", "vic") == {"roles": ["approver", "maintainer"], "privileged": ["approver"]}
    assert after("user.roles.revoke", "vic") == {"roles": ["viewer"]}
    assert admin.client.post("/ui/users/vic", {"roles": ["maintainer"]}).status_code == 302
    vic.refresh_from_db()
    assert not vic.is_active
    update = AuditEvent.objects.filter(action="user.update", target="vic").latest("seq")
    assert (update.before, update.after) == ({"is_active": True}, {"is_active": False})
    # An inactive user's session and tokens stop working.
    assert viewer.client.get("/ui/").status_code == 302


def test_an_admin_cannot_lock_themselves_out(admin):
    demote = admin.client.post("/ui/users/ada", {"roles": ["viewer"], "is_active": "on"})
    assert (demote.status_code, demote.context["error"]) == (
        400,
        "you cannot take the admin role from yourself; ask another admin",
    )
    leave = admin.client.post("/ui/users/ada", {"roles": ["admin"]})
    assert (leave.status_code, leave.context["error"]) == (400, "you cannot deactivate yourself; ask another admin")
    ada = User.objects.get(username="ada")
    assert ada.is_active and ada.groups.filter(name="admin").exists()
    assert admin.client.post("/ui/users/nobody", {"roles": []}).status_code == 404


def test_names_in_one_script_and_those_asian_languages_mix_are_accepted(admin):
    for name in ("anna.m\u00fcller", "\u0438\u0432\u0430\u043d", "\u5c71\u7530\u305f\u308d\u3046", "kim\ud55c\uad6d"):
        response = admin.client.post("/ui/users", {"username": name, "password": ""})  # as a browser sends it
        assert response.status_code == 200, response.context["error"]
        assert User.objects.filter(username=name).exists()


def test_a_set_password_link_is_only_for_someone_who_never_signed_in_or_has_no_password(admin, viewer):
    make_person("tia", Role.APPROVER)  # a token only: no password, never signed in
    response = admin.client.post("/ui/users/tia/password-link")
    assert response.status_code == 200
    assert response.context["link"][1].startswith("http://testserver/accounts/reset/")
    assert b"shown only this once" in response.content

    # vic signed in with a password of his own: a link would let an admin take his account over.
    refused = admin.client.post("/ui/users/vic/password-link")
    reason = (
        "'vic' has signed in with a password of their own: a set-password link is only for a user who never "
        "signed in or has no password; they change it themselves"
    )
    assert (refused.status_code, refused.context["error"]) == (403, reason)
    assert not AuditEvent.objects.filter(action="user.password.link", target="vic").exists()
    assert AuditEvent.objects.filter(action="access.denied", actor="ada").latest("seq").after["reason"] == reason
    page = admin.client.get("/ui/users").content
    assert b'action="/ui/users/tia/password-link"' in page
    assert b'action="/ui/users/vic/password-link"' not in page

    vic = User.objects.get(username="vic")
    vic.set_unusable_password()
    vic.save(update_fields=["password"])
    assert admin.client.post("/ui/users/vic/password-link").status_code == 200  # no usable password: allowed
    assert admin.client.post("/ui/users/nobody/password-link").status_code == 404


def test_a_role_admin_neither_changes_nor_takes_over_superuser_and_staff_accounts(admin):
    root = User.objects.create_superuser("root", "root@example.com", NEW_PASSWORD)
    User.objects.create_user("sam", password=NEW_PASSWORD, is_staff=True)
    for name, kind in (("root", "a superuser"), ("sam", "a staff")):
        off = admin.client.post(f"/ui/users/{name}", {"roles": ["viewer"]})  # deactivate, grant a role
        assert (off.status_code, off.context["error"]) == (
            403,
            f"'{name}' is {kind} account: changing its roles or access needs a superuser",
        )
        link = admin.client.post(f"/ui/users/{name}/password-link")
        assert (link.status_code, link.context["error"]) == (
            403,
            f"'{name}' is {kind} account: making a set-password link for it needs a superuser",
        )
    assert User.objects.filter(username__in=["root", "sam"], is_active=True).count() == 2
    assert not User.objects.get(username="sam").groups.exists()
    assert not AuditEvent.objects.filter(target__in=["root", "sam"], actor="ada").exclude(action="access.denied")
    page = admin.client.get("/ui/users").content
    assert page.count(b"account: only a superuser changes it.") == 2
    assert b'action="/ui/users/root"' not in page and b'action="/ui/users/sam/password-link"' not in page

    # A superuser may.
    boss = Client()
    boss.force_login(root)
    assert boss.post("/ui/users/sam", {"roles": ["viewer"], "is_active": "on"}).status_code == 302
    assert list(User.objects.get(username="sam").groups.values_list("name", flat=True)) == ["viewer"]


def test_the_home_page_links_the_django_admin_only_for_those_it_lets_in(admin, viewer):
    assert b'href="/admin/"' not in admin.client.get("/").content  # the admin role is not Django staff
    assert admin.client.get("/admin/").status_code == 302  # which the Django admin sends to its login
    assert b'href="/admin/"' not in viewer.client.get("/").content
    assert b'href="/admin/"' not in Client().get("/").content
    staff = Client()
    staff.force_login(User.objects.create_user("sam", password=NEW_PASSWORD, is_staff=True))
    assert b'href="/admin/"' in staff.get("/").content
    assert staff.get("/admin/").status_code == 200


# --- Your own password --------------------------------------------------------------------------------


def test_a_user_changes_their_own_password_and_it_is_audited(viewer):
    page = viewer.client.get("/accounts/password_change/")
    assert page.status_code == 200
    wrong = viewer.client.post(
        "/accounts/password_change/",
        {"old_password": "nope", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert wrong.status_code == 200 and wrong.context["form"].errors["old_password"]
    assert not AuditEvent.objects.filter(action="user.password.change").exists()
    done = viewer.client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert (done.status_code, done["Location"]) == (302, "/ui/")
    assert User.objects.get(username="vic").check_password(NEW_PASSWORD)
    change = AuditEvent.objects.get(action="user.password.change")
    assert (change.actor, change.target, change.after) == ("vic", "vic", {"usable": True})
    assert viewer.client.get("/ui/").status_code == 200  # still signed in here


def test_the_emailed_password_reset_is_not_offered(viewer):
    # Modelyard sends no mail; the old route made Django try SMTP and fail with a 500.
    assert Client().get("/accounts/password_reset/").status_code == 404
