"""OpenID Connect sign-in settings, read from the environment at start-up (docs/operations/oidc.md).

Kept apart from the registry's code: settings.py runs before any app is loaded. A half-set
configuration, a role map that names an unknown role, or an issuer over plain HTTP to another host
stops the start with a message naming the variable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from modelyard.env import env_str

# registry.models.Role's values (settings cannot import the models); tests/registry/test_oidc.py keeps them equal.
ROLE_NAMES = ("viewer", "maintainer", "approver", "auditor", "inference", "admin")
DISCOVERY_PATH = "/.well-known/openid-configuration"
REQUIRED = ("MODELYARD_OIDC_ISSUER", "MODELYARD_OIDC_CLIENT_ID", "MODELYARD_OIDC_CLIENT_SECRET")
OPTIONAL = (
    "MODELYARD_OIDC_PROVIDER_NAME",
    "MODELYARD_OIDC_GROUPS_CLAIM",
    "MODELYARD_OIDC_ROLE_MAP",
    "MODELYARD_OIDC_SCOPES",
    "MODELYARD_OIDC_REDIRECT_URI",
)


@dataclass(frozen=True)
class OidcConfig:
    issuer: str  # as the provider's discovery document and its ID tokens' "iss" must give it
    client_id: str
    client_secret: str
    provider_name: str  # on the login page's button: "Sign in with <provider_name>"
    groups_claim: str
    role_map: tuple[tuple[str, str], ...]  # (group, role) pairs, in the order given
    scopes: str
    redirect_uri: str  # "" = this server's /accounts/oidc/callback/ as the request reached it

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + DISCOVERY_PATH

    @property
    def managed_roles(self) -> frozenset[str]:
        """The roles the provider's groups decide, at every sign-in; others stay as admins set them."""
        return frozenset(role for _, role in self.role_map)

    def roles_for(self, groups: Iterable[str]) -> frozenset[str]:
        held = set(groups)
        return frozenset(role for group, role in self.role_map if group in held)


def parse_role_map(name: str, text: str) -> tuple[tuple[str, str], ...]:
    """``GROUP=ROLE,GROUP=ROLE``: a group may map to several roles (repeat it), and several groups to one role."""
    pairs: list[tuple[str, str]] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        group, equals, role = entry.rpartition("=")
        group, role = group.strip(), role.strip()
        if not equals or not group or not role:
            raise ImproperlyConfigured(
                f"{name}: expected GROUP=ROLE pairs separated by commas "
                f"(e.g. ml-release=approver,ml-eng=maintainer), got {entry!r}"
            )
        if role not in ROLE_NAMES:
            raise ImproperlyConfigured(
                f"{name}: unknown role {role!r} for group {group!r}; roles are {', '.join(ROLE_NAMES)}"
            )
        if (group, role) not in pairs:
            pairs.append((group, role))
    return tuple(pairs)


def _issuer(name: str, value: str) -> str:
    issuer = value.strip()
    if issuer.endswith(DISCOVERY_PATH):  # the discovery URL given whole: the issuer is what comes before it
        issuer = issuer[: -len(DISCOVERY_PATH)]
    parts = urlsplit(issuer)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise ImproperlyConfigured(
            f"{name}: expected the provider's issuer URL (https://..., as its discovery document gives it), "
            f"got {value!r}"
        )
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ImproperlyConfigured(
            f"{name}: {value!r} is plain HTTP to another host; an OpenID provider must be reached over https "
            "(http only on loopback, for testing)"
        )
    return issuer


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_oidc() -> OidcConfig | None:
    """The OpenID Connect settings, or None when sign-in with a provider is off (none of them set)."""
    read = {  # each by its literal name, so tests/test_docs.py finds it documented
        "MODELYARD_OIDC_ISSUER": env_str("MODELYARD_OIDC_ISSUER"),
        "MODELYARD_OIDC_CLIENT_ID": env_str("MODELYARD_OIDC_CLIENT_ID"),
        "MODELYARD_OIDC_CLIENT_SECRET": env_str("MODELYARD_OIDC_CLIENT_SECRET"),
        "MODELYARD_OIDC_PROVIDER_NAME": env_str("MODELYARD_OIDC_PROVIDER_NAME"),
        "MODELYARD_OIDC_GROUPS_CLAIM": env_str("MODELYARD_OIDC_GROUPS_CLAIM"),
        "MODELYARD_OIDC_ROLE_MAP": env_str("MODELYARD_OIDC_ROLE_MAP"),
        "MODELYARD_OIDC_SCOPES": env_str("MODELYARD_OIDC_SCOPES"),
        "MODELYARD_OIDC_REDIRECT_URI": env_str("MODELYARD_OIDC_REDIRECT_URI"),
    }
    values = {key: (value or "").strip() for key, value in read.items()}
    given = [key for key in REQUIRED if values[key]]
    if not given:
        if stray := [key for key in OPTIONAL if values[key]]:
            raise ImproperlyConfigured(
                f"{', '.join(stray)} set without {', '.join(REQUIRED)}: set all three to sign in with OpenID Connect"
            )
        return None
    if missing := [key for key in REQUIRED if not values[key]]:
        raise ImproperlyConfigured(
            f"OpenID Connect is half set up: {', '.join(given)} set but {', '.join(missing)} missing; "
            f"sign-in with a provider needs all of {', '.join(REQUIRED)}"
        )
    claim = values["MODELYARD_OIDC_GROUPS_CLAIM"] or "groups"
    scopes = values["MODELYARD_OIDC_SCOPES"] or "openid email profile"
    if "openid" not in scopes.split():
        raise ImproperlyConfigured(f"MODELYARD_OIDC_SCOPES: must include openid, got {scopes!r}")
    redirect = values["MODELYARD_OIDC_REDIRECT_URI"]
    if redirect and urlsplit(redirect).scheme not in ("https", "http"):
        raise ImproperlyConfigured(f"MODELYARD_OIDC_REDIRECT_URI: expected an http(s) URL, got {redirect!r}")
    return OidcConfig(
        issuer=_issuer("MODELYARD_OIDC_ISSUER", values["MODELYARD_OIDC_ISSUER"]),
        client_id=values["MODELYARD_OIDC_CLIENT_ID"],
        client_secret=values["MODELYARD_OIDC_CLIENT_SECRET"],
        provider_name=values["MODELYARD_OIDC_PROVIDER_NAME"] or "single sign-on",
        groups_claim=claim,
        role_map=parse_role_map("MODELYARD_OIDC_ROLE_MAP", values["MODELYARD_OIDC_ROLE_MAP"]),
        scopes=scopes,
        redirect_uri=redirect,
    )
