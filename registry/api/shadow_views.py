"""Shadow traffic on an alias: start, read the report, stop (thin views over ``registry.shadow.services``)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.clients import actor_from_request
from registry.models import RegisteredModel
from registry.shadow import services as shadows

DEFAULT_SAMPLE = 0.1


class ShadowInput(serializers.Serializer[Any]):
    version = serializers.IntegerField(min_value=1, help_text="the candidate version that mirrors the alias's requests")
    # Its range (above 0, at most 1) is the service's one rule and message, as the database's constraint.
    sample = serializers.FloatField(
        required=False,
        default=DEFAULT_SAMPLE,
        help_text="the share of the alias's requests mirrored: above 0, at most 1 (default 0.1)",
    )


class ShadowStopInput(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class ShadowSideSerializer(serializers.Serializer[Any]):
    answered = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # DRF takes declared fields off the class
    error_rate = serializers.FloatField(allow_null=True)
    p50_ms = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)


class ShadowOutputSerializer(serializers.Serializer[Any]):
    rows = serializers.IntegerField(help_text="rows compared (items of the first dimension)")
    cosine_p1 = serializers.FloatField(allow_null=True, help_text="1st percentile of the rows' cosine similarity")
    cosine_p50 = serializers.FloatField(allow_null=True)
    cosine_min = serializers.FloatField(allow_null=True)
    max_abs_diff = serializers.FloatField(allow_null=True)
    mean_abs_diff = serializers.FloatField(allow_null=True)
    top1_agreement = serializers.FloatField(allow_null=True, help_text="for class scores: 2-D, more than one column")
    psi = serializers.FloatField(allow_null=True, help_text="population stability index of the output values")
    mismatched = serializers.IntegerField(help_text="requests whose output the candidate lacked or shaped otherwise")
    mismatch = serializers.CharField(allow_blank=True)


class ShadowReportSerializer(serializers.Serializer[Any]):
    requests = serializers.IntegerField(help_text="sampled requests the candidate ran")
    compared = serializers.IntegerField(help_text="of those, answered by both versions")
    dropped = serializers.IntegerField(
        help_text="sampled requests not mirrored: the process was busy or the queue full"
    )
    dropped_by_reason = serializers.DictField(child=serializers.IntegerField())
    primary = ShadowSideSerializer()
    candidate = ShadowSideSerializer()
    outputs = serializers.DictField(child=ShadowOutputSerializer())


class ShadowSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    model = serializers.CharField()
    alias = serializers.CharField()
    version = serializers.IntegerField(help_text="the candidate")
    serving = serializers.IntegerField(allow_null=True, help_text="the version the alias serves now")
    sample = serializers.FloatField()
    running = serializers.BooleanField()
    started_by = serializers.CharField()
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    ended_by = serializers.CharField(allow_null=True)
    end_reason = serializers.CharField(allow_blank=True)
    workers = serializers.IntegerField(help_text="inference processes that reported counts")
    report = ShadowReportSerializer()


class AliasShadow(APIView):
    @extend_schema(responses=ShadowSerializer)
    def get(self, request: Request, name: str, alias: str) -> Response:
        """The alias's running shadow and its report; the last one when none runs."""
        model = get_object_or_404(RegisteredModel, name=name)
        return Response(shadows.shadow_current(model, alias).as_json())

    @extend_schema(request=ShadowInput, responses={201: ShadowSerializer})
    def put(self, request: Request, name: str, alias: str) -> Response:
        """Start mirroring a share of the alias's requests to a candidate (maintainer; ends a running one)."""
        model = get_object_or_404(RegisteredModel, name=name)
        data = ShadowInput(data=request.data)
        data.is_valid(raise_exception=True)
        shadow = shadows.shadow_start(
            model=model,
            alias_name=alias,
            version_number=data.validated_data["version"],
            sample=data.validated_data["sample"],
            actor=actor_from_request(request),
        )
        return Response(shadows.shadow_state(shadow).as_json(), status=status.HTTP_201_CREATED)

    @extend_schema(request=ShadowStopInput, responses={200: ShadowSerializer})
    def delete(self, request: Request, name: str, alias: str) -> Response:
        """End the running shadow (maintainer); the answer is its final report as the registry has it now."""
        model = get_object_or_404(RegisteredModel, name=name)
        data = ShadowStopInput(data=request.data)
        data.is_valid(raise_exception=True)
        shadow = shadows.shadow_stop(
            model=model, alias_name=alias, actor=actor_from_request(request), reason=data.validated_data["reason"]
        )
        return Response(shadows.shadow_state(shadow).as_json())
