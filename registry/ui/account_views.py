"""The web UI's people pages: API tokens, users and roles (admins), and passwords.

Tokens go through ``services.token_create`` and ``services.token_revoke``, as the REST API's do;
users and roles through ``services.user_invite`` and ``services.user_update_access``, which write
the same audit events as the admin's user pages; passwords through ``services.user_password_set``
after Django's own forms have checked them. Modelyard sends no mail: a set-password link is shown
once, to the admin who made it, to hand over, and only for someone who never signed in or has no
usable password (the service refuses the rest, and staff and superuser accounts unless the admin is
a superuser; the page offers only what the service allows).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.contrib.auth.views import INTERNAL_RESET_SESSION_TOKEN, PasswordChangeView, PasswordResetConfirmView
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.views.decorators.http import require_POST

from registry.access import selectors, services
from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.access.refusals import audit_access_denied
from registry.errors import InvalidInput, NotFound, RegistryError
from registry.models import PriorityClass, Role
from registry.ui.errors import error_page
from registry.ui.forms import TokenCreateForm, TokenRotateForm, UserAccessForm, UserInviteForm
from registry.ui.views import refusal, require_role

# --- Tokens -------------------------------------------------------------------------------------------


def _token_page(
    request: HttpRequest,
    *,
    form: TokenCreateForm | None = None,
    created: tuple[Any, str] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "tokens": selectors.token_list(viewer=request.user),
        "form": form or TokenCreateForm(),
        "created": created,
        "now": timezone.now(),
        "error": error,
    }
    return render(request, "modelyard/ui/tokens.html", context, status=status)


@login_required
def token_index(request: HttpRequest) -> HttpResponse:
    """GET: your tokens (admins: everyone's); POST: a new token for yourself, its secret shown in this answer only."""
    if request.method != "POST":
        return _token_page(request)
    form = TokenCreateForm(request.POST)
    if not form.is_valid():
        return _token_page(request, form=form, error=form.error_text(), status=400)
    days = form.cleaned_data["expires_days"]
    try:
        token, secret = services.token_create(
            username=request.user.get_username(),
            name=form.cleaned_data["name"],
            expires_in=timedelta(days=days) if days else None,
            only_roles=form.cleaned_data["roles"] or None,
            model_patterns=form.cleaned_data["models"],
            priority=form.cleaned_data["priority"] or PriorityClass.NORMAL,
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _token_page(request, form=form, error=exc.message, status=refusal(request, exc))
    # Rendered, not redirected: the secret is in this page and nowhere else.
    return _token_page(request, created=(token, secret))


@login_required
@require_POST
def token_rotate(request: HttpRequest, prefix: str) -> HttpResponse:
    """A new token with the old one's roles and models, shown once; the old one works ``overlap_hours`` more."""
    token = selectors.token_list(viewer=request.user).filter(prefix=prefix).first()
    form = TokenRotateForm(request.POST)
    if not form.is_valid():
        return _token_page(request, error=form.error_text(), status=400)
    hours = form.cleaned_data["overlap_hours"]
    try:
        if token is None:
            raise NotFound(f"no API token with prefix '{prefix}'")
        new, secret = services.token_rotate(
            token=token,
            overlap=timedelta(hours=24 if hours is None else hours),
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _token_page(request, error=exc.message, status=refusal(request, exc))
    return _token_page(request, created=(new, secret))


@login_required
@require_POST
def token_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    # Someone else's token is "not found" too, as in the API, so prefixes do not leak to non-admins.
    token = selectors.token_list(viewer=request.user).filter(prefix=prefix).first()
    try:
        if token is None:
            raise NotFound(f"no API token with prefix '{prefix}'")
        services.token_revoke(token=token, actor=actor_from_request(request))
    except RegistryError as exc:
        return _token_page(request, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Token {prefix} revoked; it no longer authenticates.")
    return redirect("ui:tokens")


# --- Users and roles ----------------------------------------------------------------------------------


def _users_page(
    request: HttpRequest,
    *,
    form: UserInviteForm | None = None,
    link: tuple[str, str] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "users": selectors.user_list(),
        "roles": Role.values,
        "form": form or UserInviteForm(),
        "link": link,
        "error": error,
    }
    return render(request, "modelyard/ui/users.html", context, status=status)


def _forbidden_unless_admin(request: HttpRequest) -> HttpResponse | None:
    if has_role(request.user, Role.ADMIN):
        return None
    reason = "managing users and roles needs the admin role"
    audit_access_denied(request=request, reason=reason)
    return error_page(request, 403, reason[0].upper() + reason[1:] + ".")


def _password_link(request: HttpRequest, username: str) -> tuple[str, str]:
    """(username, absolute set-password link) for the page to show once."""
    uid, token = services.user_password_link(username=username, actor=actor_from_request(request))
    path = reverse("password_reset_confirm", kwargs={"uidb64": uid, "token": token})
    return username, request.build_absolute_uri(path)


@login_required
def user_index(request: HttpRequest) -> HttpResponse:
    """GET: users and their roles; POST: invite a user, with an initial password or a set-password link."""
    if request.method != "POST":
        return _forbidden_unless_admin(request) or _users_page(request)
    form = UserInviteForm(request.POST)
    try:
        require_role(request, Role.ADMIN, what="inviting a user")
        if not form.is_valid():
            raise InvalidInput(form.error_text())
        password = form.cleaned_data["password"] or None
        user = services.user_invite(
            username=form.cleaned_data["username"],
            roles=form.cleaned_data["roles"],
            password=password,
            actor=actor_from_request(request),
        )
        link = None if password else _password_link(request, user.get_username())
    except RegistryError as exc:
        return _users_page(request, form=form, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"User '{user.get_username()}' created.")
    return _users_page(request, link=link) if link else redirect("ui:users")


@login_required
@require_POST
def user_access(request: HttpRequest, username: str) -> HttpResponse:
    """Set a user's roles (the checked boxes are the new set) and whether they may sign in."""
    form = UserAccessForm(request.POST)
    try:
        require_role(request, Role.ADMIN, what="changing a user's roles")
        if not form.is_valid():
            raise InvalidInput(form.error_text())
        services.user_update_access(
            username=username,
            roles=form.cleaned_data["roles"],
            is_active=form.cleaned_data["is_active"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _users_page(request, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"User '{username}' saved.")
    return redirect("ui:users")


@login_required
@require_POST
def user_password_link(request: HttpRequest, username: str) -> HttpResponse:
    try:
        require_role(request, Role.ADMIN, what="making a set-password link")
        link = _password_link(request, username)
    except RegistryError as exc:
        return _users_page(request, error=exc.message, status=refusal(request, exc))
    return _users_page(request, link=link)


# --- Passwords ----------------------------------------------------------------------------------------


class PasswordChange(PasswordChangeView):
    """A signed-in user changes their own password; audited as ``user.password.change``."""

    template_name = "registration/password_change_form.html"
    success_url = reverse_lazy("ui:models")

    def form_valid(self, form: PasswordChangeForm) -> HttpResponse:
        user = form.user
        services.user_password_set(
            user=user, password=form.cleaned_data["new_password1"], actor=actor_from_request(self.request)
        )
        update_session_auth_hash(self.request, user)  # stay signed in here; other sessions end
        messages.success(self.request, "Your password was changed.")
        return HttpResponseRedirect(self.get_success_url())


class PasswordSet(PasswordResetConfirmView):
    """Someone sets their password with the link an admin gave them; audited as ``user.password.change``."""

    template_name = "registration/password_set_form.html"
    success_url = reverse_lazy("login")

    def form_valid(self, form: SetPasswordForm) -> HttpResponse:
        user = form.user
        # The link proves who they are: they are the actor, though not signed in.
        actor = dataclasses.replace(actor_from_request(self.request), user=user)
        services.user_password_set(user=user, password=form.cleaned_data["new_password1"], actor=actor)
        del self.request.session[INTERNAL_RESET_SESSION_TOKEN]
        messages.success(self.request, "Your password is set. Sign in with it.")
        return HttpResponseRedirect(self.get_success_url())
