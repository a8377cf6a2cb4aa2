"""What every UI page knows of its viewer: which roles they hold, so that it links only to what they may do.

The links are a courtesy; every view and service checks the role again on the server.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from registry.access.auth import has_role
from registry.models import Role


def ui(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: ``can`` maps a capability to whether the signed-in user has it."""
    user = getattr(request, "user", None)
    return {
        "can": {
            "maintain": has_role(user, Role.MAINTAINER),  # create models, upload, request promotions
            "approve": has_role(user, Role.APPROVER),
            "audit": has_role(user, Role.AUDITOR),
            "administer": has_role(user, Role.ADMIN),  # users and roles, everyone's tokens
            # The Django admin lets in active staff accounts only, whatever their roles.
            "django_admin": bool(getattr(user, "is_active", False) and getattr(user, "is_staff", False)),
        }
    }
