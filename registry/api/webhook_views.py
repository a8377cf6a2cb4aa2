"""Webhooks for admins: register, list, change and remove endpoints, and read each one's delivery log.

A webhook's secret is shown once, in the answer that generated it; no read shows it again.
"""

from __future__ import annotations

import json
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.api.serializers import FormListField
from registry.errors import InvalidInput, NotFound
from registry.models import DeliveryStatus, RegisteredModel, Role, Webhook, WebhookDelivery, WebhookEvent
from registry.webhooks import services as webhooks


class IsAdmin(BasePermission):
    """Webhooks send the registry's events to any URL: only admins manage and read them."""

    message = "webhooks need the admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and has_role(request.user, Role.ADMIN))


class WebhookSerializer(serializers.ModelSerializer[Webhook]):
    model = serializers.CharField(source="model.name", default=None, allow_null=True)
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)

    class Meta:
        model = Webhook
        fields = ["id", "url", "events", "model", "active", "created_by", "created_at", "updated_at"]


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(help_text="the generated secret, shown only in this answer; null if you sent one")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class DeliverySerializer(serializers.ModelSerializer[WebhookDelivery]):
    id = serializers.UUIDField(source="uuid")
    model = serializers.CharField(source="model_name")
    payload = serializers.SerializerMethodField()

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event",
            "model",
            "version",
            "status",
            "attempts",
            "last_status_code",
            "last_error",
            "next_attempt_at",
            "created_at",
            "delivered_at",
            "payload",
        ]

    def get_payload(self, delivery: WebhookDelivery) -> Any:
        return json.loads(delivery.body)


class _WebhookFields(serializers.Serializer[Any]):
    # Each field optional, as a change sends them; in a form an empty one changes nothing, but an empty model
    # is none (every model).
    url = serializers.CharField(required=False, max_length=2000)
    events = FormListField(
        child=serializers.CharField(max_length=64),
        max_length=len(WebhookEvent.values),
        required=False,
        empty_is_unset=True,
    )
    # null or "": every model
    model = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=64)
    secret = serializers.CharField(required=False, max_length=200, trim_whitespace=False)
    active = serializers.BooleanField(required=False)


def _without_secret() -> Any:
    """Webhooks loaded without their secret: no read shows it, so none decrypts it (modelyard/crypto.py)."""
    return Webhook.objects.defer("secret")


def _model_named(name: str | None) -> RegisteredModel | None:
    if not name:
        return None
    found = RegisteredModel.objects.filter(name=name).first()
    if found is None:
        raise InvalidInput(f"no model named '{name}'")
    return found


class WebhookListCreate(generics.ListAPIView[Webhook]):
    permission_classes = [IsAdmin]
    serializer_class = WebhookSerializer

    class InputSerializer(_WebhookFields):
        url = serializers.CharField(max_length=2000)
        events = FormListField(
            child=serializers.CharField(max_length=64), max_length=len(WebhookEvent.values), empty_is_unset=True
        )
        model = serializers.CharField(required=False, allow_null=True, allow_blank=True, default=None, max_length=64)
        # "" (the default): generate one
        secret = serializers.CharField(
            required=False, allow_blank=True, default="", max_length=200, trim_whitespace=False
        )
        active = serializers.BooleanField(required=False, default=True)

    def get_queryset(self) -> Any:
        return Webhook.objects.select_related("model", "created_by").defer("secret")

    @extend_schema(request=InputSerializer, responses={201: WebhookCreatedSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        hook, generated = webhooks.webhook_create(
            url=fields["url"],
            events=fields["events"],
            model=_model_named(fields["model"]),
            secret=fields["secret"],
            active=fields["active"],
            actor=actor_from_request(request),
        )
        return Response({**WebhookSerializer(hook).data, "secret": generated}, status=status.HTTP_201_CREATED)


class WebhookDetail(APIView):
    permission_classes = [IsAdmin]

    class InputSerializer(_WebhookFields):
        """Any of the fields; a new secret replaces the old one at once."""

    @extend_schema(responses=WebhookSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(WebhookSerializer(get_object_or_404(_without_secret(), pk=pk)).data)

    @extend_schema(request=InputSerializer, responses=WebhookSerializer)
    def patch(self, request: Request, pk: int) -> Response:
        hook = get_object_or_404(_without_secret(), pk=pk)
        data = self.InputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        if "model" in changes:
            changes["model"] = _model_named(changes["model"])
        hook = webhooks.webhook_update(webhook=hook, actor=actor_from_request(request), **changes)
        return Response(WebhookSerializer(hook).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        hook = _without_secret().filter(pk=pk).first()
        if hook is None:
            raise NotFound(f"there is no webhook {pk}")
        webhooks.webhook_delete(webhook=hook, actor=actor_from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryList(generics.ListAPIView[WebhookDelivery]):
    """A webhook's delivery log, newest first."""

    permission_classes = [IsAdmin]
    serializer_class = DeliverySerializer

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=DeliveryStatus.values)])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        wanted = request.query_params.get("status", "")
        if wanted and wanted not in DeliveryStatus.values:
            raise InvalidInput(f"unknown status '{wanted}'; statuses are {', '.join(DeliveryStatus.values)}")
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        hook = get_object_or_404(_without_secret(), pk=self.kwargs["pk"])
        deliveries = hook.deliveries.all()
        wanted = self.request.query_params.get("status", "")
        return deliveries.filter(status=wanted) if wanted else deliveries
