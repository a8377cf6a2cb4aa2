"""API tokens: list your own (admins: everyone's), create one from a browser session, revoke or rotate by prefix,
and (admins) set a token's priority class on /v2 and gRPC; and service accounts (admins): pipelines' users, which
cannot sign in.

Secrets are never shown again after creation; only the public prefix names a token.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access import selectors, services
from registry.access.auth import has_role, user_roles
from registry.access.clients import actor_from_request
from registry.access.scopes import MAX_MODEL_PATTERNS
from registry.api.serializers import FormListField
from registry.errors import InvalidInput, NotFound, PermissionDenied
from registry.models import ApiToken, PriorityClass, Role, ServiceAccount

MAX_EXPIRES_DAYS = 3650
MAX_OVERLAP_HOURS = 24 * 90


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    user = serializers.CharField(source="user.username")
    roles = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="the roles it carries, within its user's; null: all of its user's roles",
    )
    models = serializers.ListField(
        source="model_patterns",
        child=serializers.CharField(),
        help_text="fnmatch patterns of the model names it reaches; empty: every model",
    )
    rotated_from: serializers.SlugRelatedField[ApiToken] = serializers.SlugRelatedField(
        slug_field="prefix", read_only=True, allow_null=True
    )

    class Meta:
        model = ApiToken
        fields = [
            "prefix",
            "name",
            "user",
            "roles",
            "models",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "rotated_from",
            "priority",
        ]
        extra_kwargs = {"priority": {"help_text": "its requests' class on /v2 and gRPC: high, normal or low"}}


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(help_text="the secret, shown only in this response")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class TokenCreateInput(serializers.Serializer[Any]):
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=100)
    expires_days = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_EXPIRES_DAYS
    )
    roles = FormListField(
        child=serializers.ChoiceField(choices=Role.values),
        empty_is_unset=True,
        required=False,
        allow_null=True,
        default=None,
        help_text="limit the token to these of your roles (omitted or null: all of them)",
    )
    models = FormListField(
        child=serializers.CharField(max_length=64),
        required=False,
        default=list,
        max_length=MAX_MODEL_PATTERNS,
        help_text="limit the token to models whose names match one of these fnmatch patterns ('fraud-*')",
    )
    user = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=150,
        help_text="admins: a service account to create the token for (default: yourself)",
    )
    priority = serializers.ChoiceField(
        choices=PriorityClass.choices,
        required=False,
        default=PriorityClass.NORMAL,
        help_text="admins: the token's class on /v2 and gRPC, served before lower ones (default normal)",
    )


class TokenListCreate(generics.ListAPIView[ApiToken]):
    # Every signed-in user manages their own tokens, whatever their roles.
    permission_classes = [IsAuthenticated]
    serializer_class = TokenSerializer

    @extend_schema(parameters=[OpenApiParameter("user", str, description="admins: only this user's tokens")])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        return selectors.token_list(viewer=self.request.user, username=self.request.query_params.get("user", ""))

    @extend_schema(request=TokenCreateInput, responses={201: TokenCreatedSerializer})
    def post(self, request: Request) -> Response:
        _refuse_token_minting(request)
        data = TokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        days = data.validated_data["expires_days"]
        username = _token_owner(request, data.validated_data["user"])
        token, raw = services.token_create(
            username=username,
            name=data.validated_data["name"],
            expires_in=timedelta(days=days) if days else None,
            only_roles=data.validated_data["roles"],
            model_patterns=data.validated_data["models"],
            priority=data.validated_data["priority"],
            actor=actor_from_request(request),
        )
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)


def _refuse_token_minting(request: Request) -> None:
    if request.auth is not None:
        # Otherwise one leaked token could mint others that outlive its revocation.
        raise PermissionDenied(
            "an API token cannot create tokens: sign in with your password, or run `modelyard createtoken`"
        )


def _token_owner(request: Request, username: str) -> str:
    """Whose token a request creates: the caller's own, or (admins only) a service account's."""
    if not username or username == request.user.get_username():
        return request.user.get_username()
    if not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("creating a token for another user needs the admin role")
    if not ServiceAccount.objects.filter(user__username=username).exists():
        raise InvalidInput(
            f"user: '{username}' is not a service account; people create their own tokens, signed in as themselves"
        )
    return username


class TokenRotateInput(serializers.Serializer[Any]):
    overlap_hours = serializers.IntegerField(
        required=False,
        default=24,
        min_value=0,
        max_value=MAX_OVERLAP_HOURS,
        help_text="how long the old token keeps working (default 24)",
    )
    expires_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_EXPIRES_DAYS,
        help_text="the new token's lifetime (default: the old one's)",
    )


class TokenRotate(APIView):
    """A new token with the old one's user, name, roles and models; the old one keeps working ``overlap_hours``."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=TokenRotateInput, responses={201: TokenCreatedSerializer})
    def post(self, request: Request, prefix: str) -> Response:
        _refuse_token_minting(request)
        data = TokenRotateInput(data=request.data)
        data.is_valid(raise_exception=True)
        token = selectors.token_list(viewer=request.user).filter(prefix=prefix).first()
        if token is None:
            raise NotFound(f"no API token with prefix '{prefix}'")
        days = data.validated_data["expires_days"]
        new, raw = services.token_rotate(
            token=token,
            overlap=timedelta(hours=data.validated_data["overlap_hours"]),
            expires_in=timedelta(days=days) if days else None,
            actor=actor_from_request(request),
        )
        return Response({**TokenSerializer(new).data, "token": raw}, status=status.HTTP_201_CREATED)


class TokenPriorityInput(serializers.Serializer[Any]):
    priority = serializers.ChoiceField(
        choices=PriorityClass.choices,
        required=False,
        allow_blank=True,
        default="",
        help_text="admins: the token's class on /v2 and gRPC, high, normal or low (omitted or empty: unchanged)",
    )


class TokenDetail(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=TokenPriorityInput, responses=TokenSerializer)
    def patch(self, request: Request, prefix: str) -> Response:
        """Admins: change a token's priority class (audited as ``token.priority``); the only field that changes."""
        data = TokenPriorityInput(data=request.data)
        data.is_valid(raise_exception=True)
        token = selectors.token_list(viewer=request.user).filter(prefix=prefix).first()
        if token is None:
            raise NotFound(f"no API token with prefix '{prefix}'")
        if data.validated_data["priority"]:
            token = services.token_set_priority(
                token=token, priority=data.validated_data["priority"], actor=actor_from_request(request)
            )
        return Response(TokenSerializer(token).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, prefix: str) -> Response:
        # Someone else's token is "not found" too, so prefixes do not leak to non-admins.
        token = selectors.token_list(viewer=request.user).filter(prefix=prefix).first()
        if token is None:
            raise NotFound(f"no API token with prefix '{prefix}'")
        services.token_revoke(token=token, actor=actor_from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class Me(APIView):
    """Who the caller is: what ``modelyard login`` shows, and how a client finds its own token's user."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "username": {"type": "string"},
                    "roles": {"type": "array", "items": {"type": "string"}},
                    "token": {"type": "object", "nullable": True, "description": "the token used, if any"},
                },
            }
        }
    )
    def get(self, request: Request) -> Response:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response(
            {
                "username": request.user.get_username(),
                "roles": sorted(user_roles(request.user)),
                "token": TokenSerializer(token).data if token is not None else None,
            }
        )


# --- Service accounts -----------------------------------------------------------------------------


class IsAdmin(BasePermission):
    message = "service accounts need the admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and has_role(request.user, Role.ADMIN))


class ServiceAccountSerializer(serializers.ModelSerializer[ServiceAccount]):
    username = serializers.CharField(source="user.username")
    owner = serializers.CharField(source="owner.username", allow_null=True, default=None)
    roles = serializers.SerializerMethodField()
    is_active = serializers.BooleanField(source="user.is_active")

    class Meta:
        model = ServiceAccount
        fields = ["username", "owner", "description", "roles", "is_active", "created_at"]

    def get_roles(self, account: ServiceAccount) -> list[str]:
        return sorted(group.name for group in account.user.groups.all())  # prefetched: roles only


class ServiceAccountCreateInput(serializers.Serializer[Any]):
    username = serializers.CharField(max_length=150)
    roles = FormListField(child=serializers.ChoiceField(choices=Role.values), required=False, default=list)
    owner = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=150, help_text="an admin (default: you)"
    )
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)


class ServiceAccountListCreate(generics.ListAPIView[ServiceAccount]):
    """Users for pipelines: no password, owned by an admin; give them tokens with ``POST /api/v1/tokens`` ``user``."""

    permission_classes = [IsAdmin]
    serializer_class = ServiceAccountSerializer

    def get_queryset(self) -> Any:
        return selectors.service_account_list()

    @extend_schema(request=ServiceAccountCreateInput, responses={201: ServiceAccountSerializer})
    def post(self, request: Request) -> Response:
        data = ServiceAccountCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        account = services.service_account_create(**data.validated_data, actor=actor_from_request(request))
        return Response(ServiceAccountSerializer(account).data, status=status.HTTP_201_CREATED)


class ServiceAccountDetail(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(responses=ServiceAccountSerializer)
    def get(self, request: Request, username: str) -> Response:
        account = selectors.service_account_list().filter(user__username=username).first()
        if account is None:
            raise NotFound(f"no service account named '{username}'")
        return Response(ServiceAccountSerializer(account).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, username: str) -> Response:
        services.service_account_delete(username=username, actor=actor_from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
