"""API tokens: list your own (admins: everyone's), create one from a browser session, revoke by prefix.

Secrets are never shown again after creation; only the public prefix names a token.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access import selectors, services
from registry.access.auth import user_roles
from registry.access.clients import actor_from_request
from registry.errors import NotFound, PermissionDenied
from registry.models import ApiToken

MAX_EXPIRES_DAYS = 3650


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    user = serializers.CharField(source="user.username")

    class Meta:
        model = ApiToken
        fields = ["prefix", "name", "user", "created_at", "expires_at", "last_used_at", "revoked_at"]


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(help_text="the secret, shown only in this response")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class TokenCreateInput(serializers.Serializer[Any]):
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=100)
    expires_days = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_EXPIRES_DAYS
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
        if request.auth is not None:
            # Otherwise one leaked token could mint others that outlive its revocation.
            raise PermissionDenied(
                "an API token cannot create tokens: sign in with your password, or run `modelyard createtoken`"
            )
        data = TokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        days = data.validated_data["expires_days"]
        token, raw = services.token_create(
            username=request.user.get_username(),
            name=data.validated_data["name"],
            expires_in=timedelta(days=days) if days else None,
            actor=actor_from_request(request),
        )
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)


class TokenDetail(APIView):
    permission_classes = [IsAuthenticated]

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
