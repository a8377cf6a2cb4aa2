"""Password logins lock per username and per client address after repeated failures, and say so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from registry.audit.verify import audit_verify
from registry.models import AuditEvent, AuthFailureWindow, LoginFailure

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("one_failure_minute")]

RIGHT = "correct horse battery staple"


@pytest.fixture(autouse=True)
def small_limits(settings):
    settings.LOGIN_MAX_FAILURES = 3
    settings.LOGIN_MAX_FAILURES_PER_IP = 5
    settings.LOGIN_LOCKOUT_SECONDS = 600


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user(username="alice", password=RIGHT, is_staff=True)


def login(username: str, password: str, *, ip: str = "10.0.0.1", path: str = "/accounts/login/"):
    return Client(REMOTE_ADDR=ip).post(path, {"username": username, "password": password}, HTTP_USER_AGENT="ua/1")


def signed_in(response) -> bool:
    return response.status_code == 302


def test_username_is_locked_after_failures_even_with_the_right_password(alice):
    for _ in range(3):
        response = login("alice", "wrong")
        assert response.status_code == 200
        assert b"Wrong username or password." in response.content
    refused = login("alice", RIGHT)
    assert refused.status_code == 200
    assert not signed_in(refused)
    message = refused.context["form"].locked_out
    assert message.startswith("Too many failed logins for 'alice': logging in is locked for 10 more minutes (until ")
    # The time is a <time> element, which the page's script shows in the viewer's zone like every other time.
    until = LoginFailure.objects.get(kind="user", value="alice").locked_until
    shown = (
        f"Too many failed logins for &#x27;alice&#x27;: logging in is locked for 10 more minutes "
        f'(until <time datetime="{until.isoformat()}">{until:%H:%M} UTC</time>).'
    )
    assert shown.encode() in refused.content
    # Failed logins from one address in one minute share one auth.failed event and a counted window.
    assert list(AuditEvent.objects.order_by("seq").values_list("action", flat=True)) == [
        "auth.failed",
        "auth.lockout",
    ]
    assert AuthFailureWindow.objects.get().count == 4
    lockout = AuditEvent.objects.get(action="auth.lockout")
    assert (lockout.actor, lockout.target_type, lockout.target, lockout.ip) == (
        "anonymous",
        "user",
        "alice",
        "10.0.0.1",
    )
    assert (lockout.after["failures"], lockout.after["within_seconds"]) == (3, 600)
    # The refused attempt with the right password is the window's fourth failure; no secret is recorded.
    assert all(RIGHT not in str(event.canonical()) for event in AuditEvent.objects.all())
    assert audit_verify().ok


def test_username_lock_holds_from_every_address(alice):
    for i in range(3):
        login("alice", "wrong", ip=f"10.0.1.{i}")
    assert not signed_in(login("alice", RIGHT, ip="10.9.9.9"))


def test_address_is_locked_after_failures_across_usernames(alice):
    get_user_model().objects.create_user(username="bob", password=RIGHT)
    for i in range(5):
        login(f"user{i}", "wrong", ip="10.0.0.7")
    refused = login("bob", RIGHT, ip="10.0.0.7")
    assert not signed_in(refused)
    assert refused.context["form"].locked_out.startswith("Too many failed logins from your address")
    event = AuditEvent.objects.get(action="auth.lockout", target_type="ip")
    assert (event.target, event.after["failures"]) == ("10.0.0.7", 5)
    assert signed_in(login("bob", RIGHT, ip="10.0.0.8"))


def test_ipv6_clients_are_counted_per_64(db):
    # Five failures from five addresses of one /64, each for another username, lock the whole /64.
    for number in range(1, 6):
        assert not login(f"user{number}", "wrong", ip=f"2001:db8:1:2::{number}").context["form"].locked_out
    refused = login("someone", "wrong", ip="2001:db8:1:2:ffff:ffff:ffff:9")
    assert refused.context["form"].locked_out.startswith("Too many failed logins from your address")
    assert not login("someone", "wrong", ip="2001:db8:1:3::1").context["form"].locked_out  # the next /64
    lockout = AuditEvent.objects.get(action="auth.lockout")
    assert (lockout.target_type, lockout.target, lockout.ip) == ("ip", "2001:db8:1:2::/64", "2001:db8:1:2::5")
    assert LoginFailure.objects.get(kind="ip", value="2001:db8:1:2::/64").failures == 5


def test_forwarded_for_header_does_not_escape_the_address_lock(alice):
    for i in range(5):
        Client(REMOTE_ADDR="10.0.0.7").post(
            "/accounts/login/", {"username": f"user{i}", "password": "x"}, HTTP_X_FORWARDED_FOR=f"192.0.2.{i}"
        )
    spoofed = Client(REMOTE_ADDR="10.0.0.7").post(
        "/accounts/login/", {"username": "alice", "password": RIGHT}, HTTP_X_FORWARDED_FOR="192.0.2.99"
    )
    assert not signed_in(spoofed)


def test_unknown_usernames_lock_like_real_ones(db):
    for _ in range(3):
        login("ghost", "wrong")
    refused = login("ghost", "wrong")
    assert refused.context["form"].locked_out.startswith("Too many failed logins for 'ghost'")


def test_admin_login_is_locked_too(alice):
    for _ in range(3):
        login("alice", "wrong", path="/admin/login/?next=/admin/")
    refused = login("alice", RIGHT, path="/admin/login/?next=/admin/")
    assert refused.status_code == 200
    assert b"Too many failed logins for &#x27;alice&#x27;" in refused.content
    assert AuditEvent.objects.filter(action="auth.lockout", target="alice").count() == 1


def test_a_right_password_resets_the_username_count(alice):
    for _ in range(2):
        login("alice", "wrong")
    assert signed_in(login("alice", RIGHT))
    for _ in range(2):
        login("alice", "wrong")
    assert signed_in(login("alice", RIGHT))
    assert not AuditEvent.objects.filter(action="auth.lockout").exists()


def test_lock_ends_after_the_lockout_period(alice):
    for _ in range(3):
        login("alice", "wrong")
    assert not signed_in(login("alice", RIGHT))
    past = timezone.now() - timedelta(seconds=601)
    LoginFailure.objects.update(locked_until=past, window_started_at=past)
    assert signed_in(login("alice", RIGHT))
    # A new failure starts a fresh count and prunes what has ended.
    login("bob", "wrong", ip="10.0.0.2")
    assert set(LoginFailure.objects.values_list("kind", "value", "failures")) == {
        ("user", "bob", 1),
        ("ip", "10.0.0.2", 1),
    }


def test_failures_outside_the_window_do_not_add_up(alice):
    for _ in range(2):
        login("alice", "wrong")
    LoginFailure.objects.update(window_started_at=timezone.now() - timedelta(seconds=601))
    login("alice", "wrong")
    assert signed_in(login("alice", RIGHT))
