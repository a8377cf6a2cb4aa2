"""Changes to users made in the Django admin are audited: roles, flags, passwords, creation and deletion."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from registry.audit.verify import audit_verify
from registry.models import AuditEvent, Role
from tests.support.people import make_person

pytestmark = pytest.mark.django_db

STRONG = "a long enough passphrase 8"


@pytest.fixture
def admin_browser() -> Client:
    """A superuser signed in to the Django admin."""
    root = get_user_model().objects.create_superuser("root", "root@example.com", STRONG)
    browser = Client()
    browser.force_login(root)
    return browser


def _user_events(since: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(seq__gt=since, action__startswith="user.").order_by("seq"))


def _last_seq() -> int:
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def _change_form(user, **changes) -> dict:
    """The admin's change form for ``user`` as its page would post it, with ``changes`` applied."""
    data = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": [group.pk for group in user.groups.all()],
        "user_permissions": [],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "_save": "Save",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not False}  # unticked boxes are not sent


def test_role_and_flag_changes_in_the_admin_are_audited(admin_browser):
    make_person("owner", Role.MAINTAINER)
    approver_group, _ = Group.objects.get_or_create(name=Role.APPROVER)
    user = get_user_model().objects.get(username="owner")
    since = _last_seq()

    data = _change_form(user, groups=[approver_group.pk], is_staff=True, is_superuser=True, is_active=False)
    response = admin_browser.post(f"/admin/auth/user/{user.pk}/change/", data)

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    user.refresh_from_db()
    assert (user.is_active, user.is_staff, user.is_superuser) == (False, True, True)
    events = [(e.action, e.actor, e.target, e.before, e.after) for e in _user_events(since)]
    # Granting approver, and making a superuser (who holds every role), say that they give that power.
    assert events == [
        ("user.roles.grant", "root", "owner", None, {"roles": ["approver"], "privileged": ["approver"]}),
        ("user.roles.revoke", "root", "owner", None, {"roles": ["maintainer"]}),
        (
            "user.update",
            "root",
            "owner",
            {"is_active": True, "is_staff": False, "is_superuser": False},
            {"is_active": False, "is_staff": True, "is_superuser": True, "privileged": ["admin"]},
        ),
    ]
    assert audit_verify().ok


def test_admin_edit_that_changes_no_access_records_nothing(admin_browser):
    make_person("owner", Role.MAINTAINER)
    user = get_user_model().objects.get(username="owner")
    since = _last_seq()
    response = admin_browser.post(f"/admin/auth/user/{user.pk}/change/", _change_form(user, email="o@example.com"))
    assert response.status_code == 302
    assert get_user_model().objects.get(username="owner").email == "o@example.com"
    assert _user_events(since) == []


def test_password_change_in_the_admin_is_audited_without_the_hash(admin_browser):
    make_person("owner", Role.MAINTAINER)
    user = get_user_model().objects.get(username="owner")
    since = _last_seq()
    response = admin_browser.post(
        f"/admin/auth/user/{user.pk}/password/", {"password1": STRONG, "password2": STRONG, "usable_password": "true"}
    )
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password(STRONG)
    [event] = _user_events(since)
    assert (event.action, event.actor, event.target, event.after) == (
        "user.password.change",
        "root",
        "owner",
        {"usable": True},
    )
    assert user.password not in json.dumps(event.canonical())


def test_invalid_password_form_records_nothing(admin_browser):
    make_person("owner", Role.MAINTAINER)
    user = get_user_model().objects.get(username="owner")
    since = _last_seq()
    response = admin_browser.post(f"/admin/auth/user/{user.pk}/password/", {"password1": STRONG, "password2": "x"})
    assert response.status_code == 200  # the form again, with an error
    assert _user_events(since) == []


def test_user_created_in_the_admin_is_audited(admin_browser):
    since = _last_seq()
    response = admin_browser.post(
        "/admin/auth/user/add/",
        {"username": "newcomer", "password1": STRONG, "password2": STRONG, "usable_password": "true", "_save": "Save"},
    )
    assert response.status_code == 302
    [event] = _user_events(since)
    assert (event.action, event.actor, event.target) == ("user.create", "root", "newcomer")
    assert event.after == {
        "username": "newcomer",
        "is_active": True,
        "is_staff": False,
        "is_superuser": False,
        "roles": [],
        "groups": [],
        "permissions": [],
        "usable_password": True,
    }


def test_the_admin_refuses_look_alike_usernames(admin_browser):
    make_person("ada", Role.ADMIN)
    add = {"password1": STRONG, "password2": STRONG, "usable_password": "true", "_save": "Save"}
    mixed = admin_browser.post("/admin/auth/user/add/", {"username": "\u0430da", **add})  # a Cyrillic a
    assert mixed.status_code == 200
    assert mixed.context["adminform"].form.errors["username"] == [
        "'\u0430da' mixes letters of different scripts (cyrillic, latin), which lets a name pass for another's; "
        "use one script"
    ]
    assert admin_browser.post("/admin/auth/user/add/", {"username": "Ada", **add}).status_code == 200
    make_person("bob", Role.VIEWER)
    bob = get_user_model().objects.get(username="bob")
    renamed = admin_browser.post(f"/admin/auth/user/{bob.pk}/change/", _change_form(bob, username="ADA"))
    assert renamed.status_code == 200
    assert renamed.context["adminform"].form.errors["username"] == [
        "'ADA' differs from the existing user 'ada' only in case"
    ]
    assert sorted(get_user_model().objects.values_list("username", flat=True)) == ["ada", "bob", "root"]
    # A name in one script, and renaming a user to another case of their own name, are fine.
    assert admin_browser.post("/admin/auth/user/add/", {"username": "\u0430\u0434\u0430", **add}).status_code == 302
    assert (
        admin_browser.post(f"/admin/auth/user/{bob.pk}/change/", _change_form(bob, username="Bob")).status_code == 302
    )


def test_user_deleted_in_the_admin_is_audited(admin_browser):
    make_person("leaver", Role.APPROVER)
    user = get_user_model().objects.get(username="leaver")
    since = _last_seq()
    response = admin_browser.post(f"/admin/auth/user/{user.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not get_user_model().objects.filter(username="leaver").exists()
    [event] = _user_events(since)
    assert (event.action, event.target, event.before["roles"]) == ("user.delete", "leaver", ["approver"])


def test_bulk_delete_in_the_admin_is_audited(admin_browser):
    make_person("a", Role.VIEWER)
    make_person("b", Role.VIEWER)
    pks = list(get_user_model().objects.filter(username__in=["a", "b"]).values_list("pk", flat=True))
    since = _last_seq()
    response = admin_browser.post(
        "/admin/auth/user/", {"action": "delete_selected", "_selected_action": pks, "post": "yes"}
    )
    assert response.status_code == 302
    assert sorted((e.action, e.target) for e in _user_events(since)) == [("user.delete", "a"), ("user.delete", "b")]


def test_groups_are_read_only_in_the_admin(admin_browser):
    group, _ = Group.objects.get_or_create(name=Role.VIEWER)
    assert admin_browser.get(f"/admin/auth/group/{group.pk}/change/").status_code == 200
    response = admin_browser.post(f"/admin/auth/group/{group.pk}/change/", {"name": Role.ADMIN})
    assert response.status_code == 403
    assert admin_browser.post(f"/admin/auth/group/{group.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_browser.get("/admin/auth/group/add/").status_code == 403
    group.refresh_from_db()
    assert group.name == Role.VIEWER
