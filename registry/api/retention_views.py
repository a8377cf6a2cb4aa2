"""A model's retention rule: read it, set or remove it, preview what it would do (thin views over
``registry.lifecycle.retention``).

The service checks the rule (with its exact messages) and the roles (maintainer to set a rule, admin for
one that deletes), so these views let any signed-in user through to it; a preview changes nothing and is
open to every reader. The serializers here only describe the bodies for the schema.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.clients import actor_from_request
from registry.api.parsers import JSONParser
from registry.lifecycle import retention
from registry.models import RegisteredModel


class RetentionRuleSerializer(serializers.Serializer[Any]):
    keep_last = serializers.IntegerField(
        min_value=1, max_value=retention.MAX_KEEP_LAST, help_text="the newest versions (by number) always kept"
    )
    keep_days = serializers.IntegerField(
        min_value=1,
        max_value=retention.MAX_KEEP_DAYS,
        help_text="versions created, aliased or served within this many days are kept",
    )
    then = serializers.ChoiceField(
        choices=[retention.ARCHIVE, retention.DELETE],
        default=retention.ARCHIVE,
        help_text="what happens to the others: archive (default), or delete (admin)",
    )


class RetentionSerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    rule = RetentionRuleSerializer(allow_null=True, help_text="null: no rule")


class RetentionActionSerializer(serializers.Serializer[Any]):
    version = serializers.IntegerField()
    action = serializers.ChoiceField(choices=[retention.ARCHIVE, retention.DELETE, retention.KEEP])
    why = serializers.CharField()


class RetentionPlanSerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    rule = RetentionRuleSerializer()
    as_of = serializers.DateTimeField(help_text="the moment the windows are counted back from")
    actions = RetentionActionSerializer(many=True, help_text="what the next run would do, oldest version first")
    kept = RetentionActionSerializer(
        many=True, help_text="versions outside both windows that the rule spares, and why (action 'keep')"
    )


def _answer(model: RegisteredModel) -> Response:
    return Response({"model": model.name, "rule": model.retention})


class ModelRetention(APIView):
    permission_classes = [IsAuthenticated]
    parser_classes = [JSONParser]  # a rule, or null, has no form encoding

    @extend_schema(responses=RetentionSerializer)
    def get(self, request: Request, name: str) -> Response:
        """The model's retention rule (null when it has none)."""
        return _answer(get_object_or_404(RegisteredModel, name=name))

    @extend_schema(request=RetentionRuleSerializer, responses=RetentionSerializer)
    def put(self, request: Request, name: str) -> Response:
        """Set the rule (maintainer; a rule that deletes needs an admin); a body of null removes it."""
        model = get_object_or_404(RegisteredModel, name=name)
        model = retention.retention_set(model=model, rule=request.data, actor=actor_from_request(request))
        return _answer(model)

    @extend_schema(request=None, responses={200: RetentionSerializer})
    def delete(self, request: Request, name: str) -> Response:
        """Remove the rule (maintainer): nothing is archived or deleted by a rule any more."""
        model = get_object_or_404(RegisteredModel, name=name)
        model = retention.retention_set(model=model, rule=None, actor=actor_from_request(request))
        return _answer(model)


class ModelRetentionPreview(APIView):
    permission_classes = [IsAuthenticated]
    parser_classes = [JSONParser]

    @extend_schema(request=RetentionRuleSerializer, responses=RetentionPlanSerializer)
    def post(self, request: Request, name: str) -> Response:
        """What the next run would archive or delete, and what it spares and why; changes nothing.

        The body is a rule to try before saving it; without one (no body, {} or null), the model's own rule.
        """
        model = get_object_or_404(RegisteredModel, name=name)
        rule = request.data if request.data not in (None, {}) else None
        return Response(retention.retention_plan(model=model, rule=rule).as_json())
