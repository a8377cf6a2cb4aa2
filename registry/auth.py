"""Bearer API tokens and roles.

A token looks like ``my_<prefix>_<secret>``. Only sha256 of the whole token is stored; the
prefix finds the row, and the hash is compared in constant time.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from registry.models import ApiToken, Role

TOKEN_PREFIX = "my_"


def split_token(raw: str) -> tuple[str, str] | None:
    if not raw.startswith(TOKEN_PREFIX):
        return None
    prefix, sep, secret = raw[len(TOKEN_PREFIX) :].partition("_")
    # Prefixes are hex; anything else (a NUL, say) must not reach the database lookup.
    if not sep or not prefix or not secret or not (prefix.isascii() and prefix.isalnum()):
        return None
    return prefix, secret


def authenticate_token(raw: str) -> ApiToken | None:
    parts = split_token(raw)
    if parts is None:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=parts[0], revoked_at__isnull=True).first()
    if token is None or not hmac.compare_digest(token.key_hash, ApiToken.hash_key(raw)):
        return None
    if not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = authenticate_token(raw.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API token")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def user_roles(user: Any) -> set[str]:
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return set()
    cached = getattr(user, "_modelyard_roles", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True)) & set(Role.values)
        if user.is_superuser:
            cached.add(Role.ADMIN)
        user._modelyard_roles = cached
    return set(cached)


def has_role(user: Any, *roles: str) -> bool:
    owned = user_roles(user)
    return Role.ADMIN in owned or bool(owned & set(roles))
