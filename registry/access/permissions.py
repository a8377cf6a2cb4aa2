"""Who may do what through the registry API."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from registry.access.auth import has_role
from registry.models import Role


class ReadAuthenticatedWriteMaintainer(BasePermission):
    """Any signed-in user reads; writes need the maintainer or admin role."""

    message = "this action needs the maintainer or admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in SAFE_METHODS:
            return True
        return has_role(request.user, Role.MAINTAINER)
