"""Sign-in with an OpenID Connect provider: the user an ID token's (issuer, subject) is, and roles from its groups.

The views (registry/ui/oidc_views.py) run the authorization code flow with PKCE through Authlib
and verify the ID token (signature from the provider's JWKS, issuer, audience, expiry, nonce);
this service then finds the user by (issuer, subject), creates them at their first sign-in, and
makes the roles that MODELYARD_OIDC_ROLE_MAP manages exactly those the user's groups map to. Roles
the map does not name stay as admins set them. Every change is audited as the users page's are
(``user.create``, ``user.roles.grant``, ``user.roles.revoke``), by the actor "oidc".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from modelyard.oidc_config import OidcConfig
from registry.access import services
from registry.audit.chain import Actor, audit_record
from registry.errors import InvalidInput, PermissionDenied
from registry.models import OidcIdentity

_NAME_UNSAFE = re.compile(r"[^\w.@+-]")


def config() -> OidcConfig:
    oidc = settings.OIDC
    assert oidc is not None, "OpenID Connect is not configured"
    return oidc


def groups_of(claims: Mapping[str, Any], claim: str) -> list[str]:
    """The groups in ``claim``: a list of names, or one name; anything else is refused, not read as no groups."""
    value = claims.get(claim)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise InvalidInput(f"the provider's '{claim}' claim is not a list of group names")


def _wanted_username(claims: Mapping[str, Any]) -> str:
    for key in ("preferred_username", "email", "sub"):
        value = claims.get(key)
        if isinstance(value, str) and value.strip():
            name = _NAME_UNSAFE.sub("-", value.strip())[:150]
            if name:
                return name
    raise InvalidInput("the provider's ID token names no subject")


def _actor(request_actor: Actor) -> Actor:
    """The sign-in's changes are the provider's decisions, made as this user signs in: recorded as "oidc"."""
    return Actor(
        user=None,
        ip=request_actor.ip,
        user_agent=request_actor.user_agent,
        request_id=request_actor.request_id,
        label="oidc",
    )


@transaction.atomic(durable=True)
def sign_in(*, claims: Mapping[str, Any], groups: Iterable[str], actor: Actor) -> Any:
    """The user for verified ID token ``claims`` (created at the first sign-in), with the roles their groups map to.

    Refuses (PermissionDenied) a user an admin deactivated, and (InvalidInput) a first sign-in whose
    username is already another account's: accounts are never joined by name.
    """
    oidc = config()
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise InvalidInput("the provider's ID token has no subject ('sub')")
    issuer = str(claims.get("iss") or oidc.issuer)
    by = _actor(actor)
    identity = OidcIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    User = get_user_model()
    if identity is None:
        username = _wanted_username(claims)
        if User.objects.filter(username__iexact=username).exists():
            raise InvalidInput(
                f"the username '{username}' belongs to another Modelyard account, which a sign-in with "
                f"{oidc.provider_name} never takes over; ask an admin to rename or remove it"
            )
        refusal = services.username_script_refusal(username)
        if refusal is not None:
            raise InvalidInput(f"username: {refusal}")
        user = User(username=username)
        email = claims.get("email")
        if isinstance(email, str):
            user.email = email[:254]
        user.set_unusable_password()
        user.save()
        identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        services.user_access_record(user_id=user.pk, before=None, actor=by)
    user = identity.user
    if not user.is_active:
        raise PermissionDenied(f"the account '{user.get_username()}' is deactivated; ask an admin")
    before = services.user_access_snapshot(user_id=user.pk)
    wanted = oidc.roles_for(groups)
    held = set(user.groups.values_list("name", flat=True))
    user.groups.remove(*Group.objects.filter(name__in=(oidc.managed_roles - wanted) & held))
    user.groups.add(*(Group.objects.get_or_create(name=role)[0] for role in sorted(wanted - held)))
    services.user_access_record(user_id=user.pk, before=before, actor=by)
    identity.last_login_at = timezone.now()
    identity.save(update_fields=["last_login_at"])
    return user


def record_refusal(*, reason: str, actor: Actor) -> None:
    """A sign-in the provider's answer did not allow: audited as ``auth.oidc.refused``; nobody is signed in."""
    anonymous = Actor(ip=actor.ip, user_agent=actor.user_agent, request_id=actor.request_id, label="anonymous")
    with transaction.atomic():
        audit_record(
            actor=anonymous,
            action="auth.oidc.refused",
            target_type="oidc",
            target=config().issuer,
            after={"reason": reason},
        )


class PasswordLoginBackend(ModelBackend):
    """Django's own backend, which checks no password while MODELYARD_PASSWORD_LOGIN is false.

    The login page refuses the form with a message first; this stops every other way in (the Django
    admin's login). Sessions signed in with the provider name this backend too, for permissions.
    """

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if not settings.PASSWORD_LOGIN:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
