"""Archive, legal hold and delete of versions, and deleting a model (thin views over ``registry.lifecycle.services``).

The services check the roles (maintainer to archive, admin or auditor to hold, admin to delete), so
these views let any signed-in user through to them and their exact refusals.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.access.clients import actor_from_request
from registry.api.serializers import VersionSerializer
from registry.errors import NotFound
from registry.lifecycle import services as lifecycle
from registry.models import ModelVersion, RegisteredModel


class LifecycleReason(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class LifecycleReasonRequired(serializers.Serializer[Any]):
    # Sent empty, the service answers what needs it ("deleting a version needs a reason").
    reason = serializers.CharField(allow_blank=True, max_length=2000, help_text="why (recorded in the audit log)")


def version_or_404(name: str, number: int) -> ModelVersion:
    """A version of a model, tombstones included."""
    found = selectors.version_get(model=get_object_or_404(RegisteredModel, name=name), number=number)
    if found is None:
        raise NotFound(f"model '{name}' has no version {number}")
    return found


def reason_from(request: Request) -> str:
    """The reason from a JSON or form body, or from ``?reason=`` (a DELETE sent without a body)."""
    data = LifecycleReason(data=request.data if request.data else {"reason": request.query_params.get("reason", "")})
    data.is_valid(raise_exception=True)
    return str(data.validated_data["reason"])


def _answer(name: str, number: int) -> Response:
    return Response(VersionSerializer(version_or_404(name, number)).data)


class _VersionAction(APIView):
    permission_classes = [IsAuthenticated]

    def act(self, version: ModelVersion, request: Request, reason: str) -> None:
        raise NotImplementedError

    def post(self, request: Request, name: str, version: int) -> Response:
        self.act(version_or_404(name, version), request, reason_from(request))
        return _answer(name, version)


_OPTIONAL_REASON = extend_schema(request=LifecycleReason, responses=VersionSerializer)
_REQUIRED_REASON = extend_schema(request=LifecycleReasonRequired, responses=VersionSerializer)


@extend_schema_view(post=_OPTIONAL_REASON)
class VersionArchive(_VersionAction):
    """Archive: hidden from lists, cannot be promoted, keeps its bytes (maintainer)."""

    def act(self, version: ModelVersion, request: Request, reason: str) -> None:
        lifecycle.version_archive(version=version, actor=actor_from_request(request), reason=reason)


@extend_schema_view(post=_OPTIONAL_REASON)
class VersionUnarchive(_VersionAction):
    """Unarchive (maintainer)."""

    def act(self, version: ModelVersion, request: Request, reason: str) -> None:
        lifecycle.version_unarchive(version=version, actor=actor_from_request(request), reason=reason)


@extend_schema_view(post=_REQUIRED_REASON)
class VersionHold(_VersionAction):
    """Place a legal hold, with a reason (admin or auditor)."""

    def act(self, version: ModelVersion, request: Request, reason: str) -> None:
        lifecycle.version_hold(version=version, actor=actor_from_request(request), reason=reason)


@extend_schema_view(post=_REQUIRED_REASON)
class VersionRelease(_VersionAction):
    """Release a legal hold, with a reason (admin or auditor)."""

    def act(self, version: ModelVersion, request: Request, reason: str) -> None:
        lifecycle.version_release(version=version, actor=actor_from_request(request), reason=reason)


def version_delete(request: Request, name: str, number: int) -> Response:
    """``DELETE .../versions/{n}`` (admin, with a reason): the tombstone, its files' removal under way or done."""
    lifecycle.version_delete(
        version=version_or_404(name, number), actor=actor_from_request(request), reason=reason_from(request)
    )
    return _answer(name, number)


def model_delete(request: Request, name: str) -> None:
    """``DELETE /models/{m}`` (admin, with a reason): only once every version is deleted."""
    model = get_object_or_404(RegisteredModel, name=name)
    lifecycle.model_delete(model=model, actor=actor_from_request(request), reason=reason_from(request))
