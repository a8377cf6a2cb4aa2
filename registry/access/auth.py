"""Bearer API tokens and roles.

A token looks like ``my_<prefix>_<secret>``. Only sha256 of the whole token is stored; the
prefix finds the row, and the hash is compared in constant time. A revoked token, an expired one
and one whose user is inactive do not authenticate.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from registry.access.scopes import effective_roles
from registry.access.throttling import ClientAddressThrottle, client_address
from registry.models import ApiToken, Role

TOKEN_PREFIX = "my_"


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (blank if none follows); None for any other scheme.

    Every place that reads the header parses it here: the API's authentication, the audit of a
    refused token, and ``/v2`` (through ``registry.serving``).
    """
    scheme, _, raw = header.partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else None


def split_token(raw: str) -> tuple[str, str] | None:
    if not raw.startswith(TOKEN_PREFIX):
        return None
    prefix, sep, secret = raw[len(TOKEN_PREFIX) :].partition("_")
    # Prefixes are hex; anything else (a NUL, say) must not reach the database lookup.
    if not sep or not prefix or not secret or not (prefix.isascii() and prefix.isalnum()):
        return None
    return prefix, secret


INVALID_TOKEN = "invalid or revoked API token"


class TokenRefused(Exception):
    """Why a presented token does not authenticate; the message is safe to show its sender."""

    def __init__(self, message: str = INVALID_TOKEN, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


def verify_token(raw: str) -> ApiToken:
    """The token's row, with its user; raises TokenRefused. Records when it was last used (once a minute)."""
    parts = split_token(raw)
    if parts is None:
        raise TokenRefused()
    token = ApiToken.objects.select_related("user").filter(prefix=parts[0], revoked_at__isnull=True).first()
    if token is None or not hmac.compare_digest(token.key_hash, ApiToken.hash_key(raw)):
        raise TokenRefused()
    if not token.user.is_active:
        raise TokenRefused()
    now = timezone.now()
    if token.expires_at is not None and token.expires_at <= now:
        # Only the holder of the whole secret gets here, so naming the expiry tells nobody else anything.
        raise TokenRefused(f"API token {token.prefix} expired at {token.expires_at.isoformat()}", expired=True)
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def authenticate_token(raw: str) -> ApiToken | None:
    try:
        return verify_token(raw)
    except TokenRefused:
        return None


class TokenExpired(exceptions.AuthenticationFailed):
    """An expired token: a 401 whose message says so (other refusals keep the generic message)."""


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        raw = bearer_token(authentication.get_authorization_header(request).decode("latin-1"))
        if raw is None:
            return None
        try:
            token = verify_token(raw)
        except TokenRefused as exc:
            # A bad token counts against its sender's address like any request without valid
            # credentials: past the rate, guessing gets 429 and no longer writes an audit event each time.
            ClientAddressThrottle().consume(f"ip:{client_address(request)}")
            raise (TokenExpired if exc.expired else exceptions.AuthenticationFailed)(str(exc)) from exc
        limit_to_token(token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class AddressCount(authentication.BaseAuthentication):
    """The last authenticator, reached only by a request without credentials: counts it against its address.

    DRF asks the permissions before the throttles, so a throttle never sees a request that a
    permission refuses for want of credentials (401), and such requests went unlimited. Counted
    here, before any permission, it is refused with 429 past ``MODELYARD_API_RATE_ANON``. A bad
    token is counted by :class:`BearerTokenAuthentication`; a valid token or session never gets here.
    """

    def authenticate(self, request: Request) -> None:
        ClientAddressThrottle().consume(f"ip:{client_address(request)}")
        return None


def user_roles(user: Any) -> set[str]:
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return set()
    cached = getattr(user, "_modelyard_roles", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True)) & set(Role.values)
        if user.is_superuser:
            cached.add(Role.ADMIN)
        token = getattr(user, "_modelyard_token", None)
        if token is not None:  # authenticated with an API token: only the roles it carries (limit_to_token)
            cached = effective_roles(cached, token)
        user._modelyard_roles = cached
    return set(cached)


def token_roles(token: ApiToken) -> set[str]:
    """The roles ``token`` carries now: its own that its user holds (``registry.access.scopes``)."""
    return effective_roles(user_roles(token.user), token)


def limit_to_token(token: ApiToken) -> None:
    """Make every role check of this request (``has_role(token.user, ...)``) see only the token's roles.

    Decided when first asked (:func:`user_roles`), so a request that checks no role costs no query.
    """
    token.user._modelyard_token = token  # type: ignore[attr-defined]  # read by user_roles


def has_role(user: Any, *roles: str) -> bool:
    owned = user_roles(user)
    return Role.ADMIN in owned or bool(owned & set(roles))
