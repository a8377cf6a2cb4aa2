"""An alias's promotion policy: read it, write a new version, ask what it says of a version (thin views
over ``registry.policy.services``)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.clients import actor_from_request
from registry.models import RegisteredModel
from registry.policy import services as policies


class RuleInput(serializers.Serializer[Any]):
    # Lengths and the name's form are the engine's rules (registry/policy/engine.py), with its messages.
    name = serializers.CharField(help_text="a lowercase slug, unique in the policy")
    expr = serializers.CharField(help_text="a CEL expression that must be true for a version to pass")
    message = serializers.CharField(required=False, allow_blank=True, default="", help_text="shown when it fails")


class PolicyInput(serializers.Serializer[Any]):
    rules = RuleInput(many=True, allow_empty=True)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class RuleSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    expr = serializers.CharField()
    message = serializers.CharField(allow_blank=True)
    builtin = serializers.BooleanField(help_text="made from the alias's settings (no policy written yet)")


class PendingPolicySerializer(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    promotion = serializers.IntegerField(help_text="the promotion request it waits for")
    rules = RuleInput(many=True)


class PolicySerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    alias = serializers.CharField()
    number = serializers.IntegerField(help_text="the policy version in force; 0 for the built-in policy")
    builtin = serializers.BooleanField()
    rules = RuleSerializer(many=True)
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    pending = PendingPolicySerializer(allow_null=True)


class PolicyRequestedSerializer(PolicySerializer):
    promotion = serializers.IntegerField(help_text="the promotion request the new version waits for")


class EvaluateInput(serializers.Serializer[Any]):
    version = serializers.IntegerField(min_value=1)


class RuleResultSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    passed = serializers.BooleanField()
    why = serializers.CharField(allow_blank=True, help_text="why it failed: its message, missing evidence, an error")
    waiting = serializers.BooleanField(help_text="it refers to approvals, so it is decided at approval")


class EvaluationSerializer(serializers.Serializer[Any]):
    version = serializers.IntegerField()
    policy = serializers.IntegerField()
    builtin = serializers.BooleanField()
    passed = serializers.BooleanField(help_text="every rule passed")
    rules = RuleResultSerializer(many=True)


class AliasPolicy(APIView):
    parser_classes = [JSONParser]  # a list of rules has no form encoding

    @extend_schema(responses=PolicySerializer)
    def get(self, request: Request, name: str, alias: str) -> Response:
        """The alias's policy in force (its built-in one until one is written) and a change waiting for approval."""
        model = get_object_or_404(RegisteredModel, name=name)
        return Response(policies.policy_view(model=model, alias_name=alias).as_json())

    @extend_schema(request=PolicyInput, responses={201: PolicySerializer, 202: PolicyRequestedSerializer})
    def put(self, request: Request, name: str, alias: str) -> Response:
        """Write a new version of the policy (maintainer); on a protected alias it waits for a second person."""
        model = get_object_or_404(RegisteredModel, name=name)
        data = PolicyInput(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = policies.policy_set(
            model=model,
            alias_name=alias,
            rules=data.validated_data["rules"],
            actor=actor_from_request(request),
            reason=data.validated_data["reason"],
        )
        if outcome.promotion is None:
            return Response(outcome.view.as_json(), status=status.HTTP_201_CREATED)
        return Response({**outcome.view.as_json(), "promotion": outcome.promotion.pk}, status=status.HTTP_202_ACCEPTED)


class AliasPolicyEvaluate(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=EvaluateInput, responses=EvaluationSerializer)
    def post(self, request: Request, name: str, alias: str) -> Response:
        """What the policy would say now of promoting a version to the alias; asks for nothing, changes nothing."""
        model = get_object_or_404(RegisteredModel, name=name)
        data = EvaluateInput(data=request.data)
        data.is_valid(raise_exception=True)
        check = policies.policy_evaluate(
            model=model,
            alias_name=alias,
            version_number=data.validated_data["version"],
            actor=actor_from_request(request),
        )
        return Response({"version": data.validated_data["version"], "passed": check.passed, **check.as_json()})
