"""Reads of users and tokens, for the API and the UI."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Prefetch, QuerySet

from registry.access.auth import has_role
from registry.models import ApiToken, AuditEvent, Role, ServiceAccount


def token_list(*, viewer: Any, username: str = "") -> QuerySet[ApiToken]:
    """The tokens ``viewer`` may see, newest first: every token for an admin, otherwise their own."""
    tokens = ApiToken.objects.select_related("user", "rotated_from")
    if not has_role(viewer, Role.ADMIN):
        tokens = tokens.filter(user=viewer)
    if username:
        tokens = tokens.filter(user__username=username)
    return tokens.order_by("-created_at", "-id")


PRIVILEGED_GRANTS_SHOWN = 50


def privileged_grant_list(*, since: datetime) -> QuerySet[AuditEvent]:
    """Grants of the approver or admin role (one admin's decision each) since ``since``, newest first."""
    events = AuditEvent.objects.filter(at__gte=since, target_type="user", after__has_key="privileged")
    return events.order_by("-seq")


def user_list() -> QuerySet[Any]:
    """Every user with their groups (the roles), by name."""
    roles = Prefetch("groups", queryset=Group.objects.filter(name__in=Role.values).order_by("name"), to_attr="roles")
    return get_user_model().objects.prefetch_related(roles).order_by("username")


def service_account_list() -> QuerySet[ServiceAccount]:
    """Every service account with its user, its roles and its owner, by name."""
    roles = Prefetch("user__groups", queryset=Group.objects.filter(name__in=Role.values))
    return ServiceAccount.objects.select_related("user", "owner").prefetch_related(roles).order_by("user__username")
