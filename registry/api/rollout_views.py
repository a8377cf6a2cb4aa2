"""Weighted canaries and stepped rollouts on an alias (thin views over ``registry.rollout.services``)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.clients import actor_from_request
from registry.api.serializers import FormListField, ReasonInput
from registry.models import RegisteredModel, RolloutState
from registry.rollout import services as rollouts


class RolloutInput(serializers.Serializer[Any]):
    version = serializers.IntegerField(min_value=1, help_text="the candidate version")
    # In a form, repeated fields; one left empty is the default steps.
    steps = FormListField(
        child=serializers.IntegerField(min_value=1, max_value=100),
        empty_is_unset=True,
        required=False,
        allow_empty=False,
        max_length=rollouts.MAX_STEPS,
        help_text="the candidate's share of the alias's requests at each step, in percent (default [5, 25, 50, 100])",
    )
    step_seconds = serializers.IntegerField(
        required=False, min_value=1, max_value=7 * 24 * 3600, help_text="how long each step runs (default 300)"
    )
    max_error_rate = serializers.FloatField(
        required=False, min_value=0, max_value=1, help_text="the candidate's error rate that rolls back (default 0.005)"
    )
    max_p99_ratio = serializers.FloatField(
        required=False, min_value=0.01, help_text="candidate p99 / current p99 that rolls back (default 1.2)"
    )
    min_requests = serializers.IntegerField(
        required=False, min_value=1, help_text="requests the candidate needs in a step to pass it (default 200)"
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    force = serializers.BooleanField(
        required=False, default=False, help_text="past a breaking signature or the alias's policy, with a reason"
    )


class RolloutSideSerializer(serializers.Serializer[Any]):
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]  # DRF takes declared fields off the class
    error_rate = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)


class RolloutCheckSerializer(serializers.Serializer[Any]):
    checked_at = serializers.DateTimeField()
    step = serializers.IntegerField()
    elapsed = serializers.FloatField()
    candidate = RolloutSideSerializer()
    current = RolloutSideSerializer()
    waiting = serializers.CharField(required=False)


class RolloutSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    model = serializers.CharField()
    alias = serializers.CharField()
    version = serializers.IntegerField(help_text="the candidate")
    base_version = serializers.IntegerField(help_text="the version the alias served when the rollout was asked for")
    state = serializers.ChoiceField(choices=RolloutState.choices)
    steps = serializers.ListField(child=serializers.IntegerField())
    step = serializers.IntegerField(help_text="index into steps")
    percent = serializers.IntegerField(help_text="the candidate's share of the alias's requests now")
    step_seconds = serializers.IntegerField()
    step_elapsed = serializers.FloatField()
    max_error_rate = serializers.FloatField()
    max_p99_ratio = serializers.FloatField()
    min_requests = serializers.IntegerField()
    promotion = serializers.IntegerField(allow_null=True, help_text="the approval request, on a protected alias")
    started_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    end_reason = serializers.CharField(allow_blank=True)
    last_check = RolloutCheckSerializer(allow_null=True, help_text="the figures of the current step, last checked")


def _model(name: str) -> RegisteredModel:
    return get_object_or_404(RegisteredModel, name=name)


class AliasRollout(APIView):
    @extend_schema(responses=RolloutSerializer)
    def get(self, request: Request, name: str, alias: str) -> Response:
        """The alias's live rollout (pending, running or paused), else its last one."""
        return Response(rollouts.rollout_json(rollouts.rollout_current(_model(name), alias)))

    @extend_schema(request=RolloutInput, responses={201: RolloutSerializer, 202: RolloutSerializer})
    def put(self, request: Request, name: str, alias: str) -> Response:
        """Start a stepped rollout (maintainer); 202 when a protected alias makes it wait for approval."""
        data = RolloutInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        rollout = rollouts.rollout_start(
            model=_model(name),
            alias_name=alias,
            version_number=values["version"],
            actor=actor_from_request(request),
            steps=values.get("steps"),
            step_seconds=values.get("step_seconds"),
            max_error_rate=values.get("max_error_rate"),
            max_p99_ratio=values.get("max_p99_ratio"),
            min_requests=values.get("min_requests"),
            reason=values["reason"],
            force=values["force"],
        )
        pending = rollout.state == RolloutState.PENDING
        return Response(
            rollouts.rollout_json(rollout), status=status.HTTP_202_ACCEPTED if pending else status.HTTP_201_CREATED
        )


def _action(change: Any) -> type[APIView]:
    class RolloutAction(APIView):
        @extend_schema(request=ReasonInput, responses=RolloutSerializer)
        def post(self, request: Request, name: str, alias: str) -> Response:
            data = ReasonInput(data=request.data)
            data.is_valid(raise_exception=True)
            rollout = change(
                model=_model(name),
                alias_name=alias,
                actor=actor_from_request(request),
                reason=data.validated_data["reason"],
            )
            return Response(rollouts.rollout_json(rollout))

    RolloutAction.__doc__ = change.__doc__
    RolloutAction.__name__ = RolloutAction.__qualname__ = f"Rollout{change.__name__.removeprefix('rollout_').title()}"
    return RolloutAction


RolloutPause = _action(rollouts.rollout_pause)
RolloutResume = _action(rollouts.rollout_resume)
RolloutAbort = _action(rollouts.rollout_abort)
