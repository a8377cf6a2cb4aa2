"""Password login lockout, per username and per client address, for /accounts/login/ and /admin/login/.

After ``LOGIN_MAX_FAILURES`` failures for one username (or ``LOGIN_MAX_FAILURES_PER_IP`` from one
address) within ``LOGIN_LOCKOUT_SECONDS``, logins for it are refused for that long, even with the
right password. The per-username limit stops guessing one account from many addresses; the
per-address limit stops one address trying many accounts. An IPv6 client is counted by its /64, the
block one host is usually given whole (else each of its 2**64 addresses would get a count of its
own). Unknown usernames count the same way, so a lock tells nobody whether an account exists. API
tokens are not affected.

Counts live in a table rather than the cache: every server process sees the same numbers on
SQLite and PostgreSQL with no Redis, and a restart does not forgive an attacker. Failures are
counted from Django's ``user_login_failed`` signal, as the audit log records them; the lock and
each refused attempt are audited too (``auth.lockout``, and ``auth.failed`` with the reason).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.access.clients import actor_from_request
from registry.access.refusals import audit_auth_failed
from registry.access.throttling import client_address
from registry.audit.chain import Actor, audit_record
from registry.models import LoginFailure, ServiceAccount

USER = "user"
IP = "ip"


def _window() -> timedelta:
    return timedelta(seconds=settings.LOGIN_LOCKOUT_SECONDS)


IPV6_PREFIX = 64


def address_key(address: str) -> str:
    """What the per-address count is kept under: the address, or an IPv6 address's /64 (``2001:db8:1:2::/64``)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(parsed), IPV6_PREFIX), strict=False))  # int(): without a %scope
    return address


def _caller(request: Any) -> str:
    return address_key(client_address(request)) if request is not None else ""


def login_lock(*, username: str, address: str) -> LoginFailure | None:
    """The lock that refuses a login for this username or from this address (or its /64) now, if any."""
    keys = Q(kind=USER, value=username[:150])
    if address:
        keys |= Q(kind=IP, value=address_key(address))
    return LoginFailure.objects.filter(keys, locked_until__gt=timezone.now()).order_by("-locked_until").first()


def login_failure_record(*, username: str, request: Any = None) -> None:
    """Count one failed login for the username and the caller's address (or /64); lock what reached its limit."""
    address = _caller(request)
    now = timezone.now()
    with transaction.atomic():
        _prune(now)
        if username:
            _count(USER, username[:150], settings.LOGIN_MAX_FAILURES, now, request)
        if address:
            _count(IP, address, settings.LOGIN_MAX_FAILURES_PER_IP, now, request)


def login_success(*, username: str) -> None:
    """A right password ends the username's count; the address keeps its count, so one owned account cannot reset it."""
    LoginFailure.objects.filter(kind=USER, value=username[:150]).delete()


def _count(kind: str, value: str, limit: int, now: datetime, request: Any) -> None:
    row, _ = LoginFailure.objects.select_for_update().get_or_create(
        kind=kind, value=value, defaults={"window_started_at": now}
    )
    if row.window_started_at <= now - _window():
        row.failures, row.window_started_at = 0, now
    row.failures += 1
    locked = row.locked_until is not None and row.locked_until > now
    if row.failures >= limit and not locked:
        row.locked_until = now + _window()
        audit_record(
            actor=_anonymous(request),
            action="auth.lockout",
            target_type=kind,
            target=value,
            after={
                "failures": row.failures,
                "within_seconds": settings.LOGIN_LOCKOUT_SECONDS,
                "locked_until": row.locked_until.isoformat(),
            },
        )
    row.save()


def _prune(now: datetime) -> None:
    """Forget counts whose window and lock have both ended, so the table stays as small as the recent attacks."""
    ended = Q(locked_until__isnull=True) | Q(locked_until__lte=now)
    LoginFailure.objects.filter(ended, window_started_at__lte=now - _window()).delete()


def _anonymous(request: Any) -> Actor:
    if request is None:
        return Actor(label="anonymous")
    actor = actor_from_request(request)
    return Actor(ip=actor.ip, user_agent=actor.user_agent, request_id=actor.request_id, label="anonymous")


@dataclass(frozen=True)
class Refusal:
    """Why a login is refused, in two parts: the login page shows ``until`` in the viewer's own zone."""

    lead: str
    until: datetime

    def __str__(self) -> str:  # where no script turns the time into the viewer's zone (the admin's login)
        return f"{self.lead} (until {self.until:%H:%M} UTC)."


def refusal(lock: LoginFailure, username: str) -> Refusal:
    assert lock.locked_until is not None
    minutes = max(1, math.ceil((lock.locked_until - timezone.now()).total_seconds() / 60))
    who = f"for '{username}'" if lock.kind == USER else "from your address"
    plural = "s" if minutes > 1 else ""
    return Refusal(
        lead=f"Too many failed logins {who}: logging in is locked for {minutes} more minute{plural}",
        until=lock.locked_until,
    )


def on_user_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Receiver of Django's ``user_login_failed``: counts the failure."""
    login_failure_record(username=str(credentials.get("username", "")), request=request)


class LockoutMixin:
    """Refuses a locked-out login before the password is even checked, with a message saying why."""

    request: Any
    cleaned_data: dict[str, Any]
    locked_out = ""  # the whole message
    lockout: Refusal | None = None  # its parts, for the login page
    service_account = ""  # why a service account cannot sign in, for the login page

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        address = _caller(self.request)
        lock = login_lock(username=username, address=address)
        if lock is not None:
            self.lockout = refusal(lock, username)
            self.locked_out = str(self.lockout)
            audit_auth_failed(
                request=self.request,
                target_type="user",
                target=username,
                reason=f"locked out ({lock.kind} {lock.value}) until {lock.locked_until:%Y-%m-%dT%H:%M:%SZ}",
            )
            raise forms.ValidationError(self.locked_out, code="locked_out")
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError as exc:
            # A pipeline's account has no password: say so, not "wrong password" (still counted as a failure).
            if exc.code == "invalid_login" and ServiceAccount.objects.filter(user__username=username).exists():
                self.service_account = SERVICE_ACCOUNT_LOGIN.format(username=username)
                raise forms.ValidationError(self.service_account, code="service_account") from exc
            raise
        login_success(username=username)
        return cleaned


SERVICE_ACCOUNT_LOGIN = "'{username}' is a service account: it cannot sign in, and works only with its API tokens"


class LockoutAuthenticationForm(LockoutMixin, AuthenticationForm):
    """/accounts/login/."""


class LockoutAdminAuthenticationForm(LockoutMixin, AdminAuthenticationForm):
    """/admin/login/."""
