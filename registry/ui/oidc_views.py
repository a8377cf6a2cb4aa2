"""The login page, and sign-in with an OpenID Connect provider (docs/operations/oidc.md).

``/accounts/oidc/login/`` sends the browser to the provider (authorization code flow, PKCE S256,
a state and a nonce kept in the session); ``/accounts/oidc/callback/`` takes the code back,
exchanges it with the client secret and verifies the ID token with Authlib: the signature with the
provider's published keys, the issuer, the audience (this client), the expiry and the nonce. Only
then does registry/access/oidc.py find or create the user and set their roles. Whatever fails is
shown on the login page, audited as ``auth.oidc.refused``, and signs nobody in.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import requests
from authlib.integrations.base_client.errors import MismatchingStateError, OAuthError
from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.views import LoginView
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from joserfc.errors import ClaimError, ExpiredTokenError, JoseError

from modelyard.oidc_config import OidcConfig
from registry.access import oidc
from registry.access.clients import actor_from_request
from registry.errors import RegistryError

log = logging.getLogger(__name__)

NEXT_KEY = "modelyard_oidc_next"
BACKEND = "registry.access.oidc.PasswordLoginBackend"
PASSWORD_OFF = "Password sign-in is turned off here: sign in with {provider}."


class SignInView(LoginView):
    """Django's login view, with the provider's button, and the password form refused when it is turned off."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["oidc_provider"] = settings.OIDC.provider_name if settings.OIDC else ""
        context["password_login"] = settings.PASSWORD_LOGIN
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.PASSWORD_LOGIN:
            provider = settings.OIDC.provider_name if settings.OIDC else "your company's provider"
            messages.error(request, PASSWORD_OFF.format(provider=provider))
            return self.render_to_response(self.get_context_data(), status=403)
        return super().post(request, *args, **kwargs)


@functools.lru_cache(maxsize=4)
def _client(config: OidcConfig) -> Any:
    """One Authlib client per configuration: it keeps the discovery document and the provider's keys."""
    oauth = OAuth()
    oauth.register(
        name="modelyard",
        client_id=config.client_id,
        client_secret=config.client_secret,
        server_metadata_url=config.discovery_url,
        client_kwargs={"scope": config.scopes, "code_challenge_method": "S256", "default_timeout": 10},
    )
    return oauth.create_client("modelyard")


def _redirect_uri(request: HttpRequest, config: OidcConfig) -> str:
    return config.redirect_uri or request.build_absolute_uri(reverse("oidc_callback"))


def _checked_metadata(client: Any, config: OidcConfig) -> dict[str, Any]:
    metadata: dict[str, Any] = client.load_server_metadata()
    if metadata.get("issuer") != config.issuer:
        client.server_metadata.clear()  # read again next time: the operator may be fixing it
        raise RegistryError(
            f"the provider's discovery document names the issuer {metadata.get('issuer')!r}, not "
            f"{config.issuer!r} (MODELYARD_OIDC_ISSUER)"
        )
    return metadata


def oidc_login(request: HttpRequest) -> HttpResponse:
    """Start a sign-in with the provider; ``next`` (a path on this site) is where it ends."""
    config = settings.OIDC
    if config is None:
        raise Http404("sign-in with an OpenID Connect provider is not configured")
    wanted = request.GET.get("next", "")
    safe = url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()}, require_https=False)
    request.session[NEXT_KEY] = wanted if wanted and safe else ""
    client = _client(config)
    try:
        _checked_metadata(client, config)
        return client.authorize_redirect(request, _redirect_uri(request, config))
    except RegistryError as exc:
        return _refuse(request, config, exc.message)
    except (requests.RequestException, ValueError) as exc:
        log.warning("OpenID provider %s unreachable: %s", config.discovery_url, exc)
        return _refuse(request, config, f"could not read the provider's discovery document ({type(exc).__name__})")


def oidc_callback(request: HttpRequest) -> HttpResponse:
    """The provider's answer: verify it, then sign the user in; refused answers go back to the login page."""
    config = settings.OIDC
    if config is None:
        raise Http404("sign-in with an OpenID Connect provider is not configured")
    client = _client(config)
    options = {
        "iss": {"essential": True, "value": config.issuer},
        "aud": {"essential": True, "value": config.client_id},
    }
    try:
        _checked_metadata(client, config)
        token = client.authorize_access_token(request, claims_options=options)
        claims = dict(token.get("userinfo") or {})
        if not claims:
            raise RegistryError("the provider answered without an ID token")
        if config.groups_claim not in claims and client.server_metadata.get("userinfo_endpoint"):
            extra = client.userinfo(token=token)
            if extra.get("sub") != claims["sub"]:
                raise RegistryError("the provider's userinfo is about another subject than its ID token")
            claims.setdefault(config.groups_claim, extra.get(config.groups_claim))
        groups = oidc.groups_of(claims, config.groups_claim)
        user = oidc.sign_in(claims=claims, groups=groups, actor=actor_from_request(request))
    except MismatchingStateError:
        return _refuse(request, config, "the sign-in expired or was started in another browser; start it again")
    except OAuthError as exc:
        return _refuse(request, config, f"the provider answered {exc.error}: {exc.description or 'no reason given'}")
    except ExpiredTokenError:
        return _refuse(request, config, "the provider's ID token has expired")
    except ClaimError as exc:
        return _refuse(request, config, _claim_refusal(exc.claim))
    except JoseError as exc:
        return _refuse(request, config, f"the provider's ID token could not be verified ({exc.error})")
    except RegistryError as exc:
        return _refuse(request, config, exc.message)
    except (requests.RequestException, ValueError) as exc:
        log.warning("OpenID provider %s: %s", config.issuer, exc)
        return _refuse(request, config, f"could not complete the exchange with the provider ({type(exc).__name__})")
    login(request, user, backend=BACKEND)
    target = request.session.pop(NEXT_KEY, "") or settings.LOGIN_REDIRECT_URL
    return HttpResponseRedirect(target)


def _claim_refusal(claim: str) -> str:
    return {
        "aud": "the provider's ID token was issued for another application (its audience is not this client)",
        "azp": "the provider's ID token was issued for another application (its audience is not this client)",
        "iss": "the provider's ID token comes from another issuer",
        "nonce": "the provider's ID token answers another sign-in (nonce mismatch)",
        "exp": "the provider's ID token has expired",
    }.get(claim, f"the provider's ID token has a bad '{claim}' claim")


def _refuse(request: HttpRequest, config: OidcConfig, reason: str) -> HttpResponse:
    oidc.record_refusal(reason=reason, actor=actor_from_request(request))
    messages.error(request, f"Sign-in with {config.provider_name} was refused: {reason}.")
    return HttpResponseRedirect(reverse("login"))
