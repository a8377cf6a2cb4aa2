"""Aliases and promotion requests: thin views over registry.promotions."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.shortcuts import get_object_or_404
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from modelyard.error_body import error_body
from registry import promotions, selectors, serving
from registry.access.clients import actor_from_request
from registry.access.scopes import model_scope_q, token_patterns
from registry.api.serializers import FormListField, ReasonInput
from registry.comparison import compare
from registry.errors import InvalidInput
from registry.models import Alias, AliasMove, PromotionKind, PromotionRequest, PromotionState, RegisteredModel


class AliasSerializer(serializers.ModelSerializer[Alias]):
    alias = serializers.CharField(source="name")
    # null for an alias made by a protected promotion that waits for its approval
    version = serializers.IntegerField(source="version.version", default=None, allow_null=True)
    # Whether a version needs an uploader's signature to be set here, and by whom (empty: any trusted signer).
    trusted_signers = serializers.ListField(child=serializers.CharField())
    # The response cache: {"max_bytes", "ttl_seconds"}, or null when off.
    cache = serializers.JSONField(read_only=True, allow_null=True)

    class Meta:
        model = Alias
        fields = [
            "alias",
            "version",
            "protected",
            "served",
            "max_slowdown_percent",
            "min_cosine",
            "max_abs_diff",
            "require_signature",
            "trusted_signers",
            "cache",
            "updated_at",
        ]


class PromotionSerializer(serializers.ModelSerializer[PromotionRequest]):
    model = serializers.CharField(source="alias.model.name")
    alias = serializers.CharField(source="alias.name")
    # null for an unprotect request, which names no version
    version = serializers.IntegerField(source="version.version", default=None, allow_null=True)
    base_version = serializers.IntegerField(source="base_version.version", default=None, allow_null=True)
    requested_by = serializers.CharField(source="requested_by.username")
    decided_by = serializers.CharField(source="decided_by.username", default=None, allow_null=True)
    # "v7 against v5 (production): 1.9x throughput at batch 32 on ..., p99 -41%, cosine 0.9996, ..."
    comparison = serializers.SerializerMethodField()
    # The candidate's shadow report on this alias as it stood when the request was made (null if never shadowed)
    shadow_report = serializers.JSONField(allow_null=True, read_only=True)
    # The alias's policy, rule by rule, when the request was made and when it was approved (null before):
    # {"policy": number, "builtin": bool, "rules": [{"name", "passed", "why", "waiting"}]}
    policy_results = serializers.JSONField(allow_null=True, read_only=True)
    policy_results_at_approval = serializers.JSONField(allow_null=True, read_only=True)

    class Meta:
        model = PromotionRequest
        fields = [
            "id",
            "kind",
            "model",
            "alias",
            "version",
            "base_version",
            "state",
            "reason",
            "force",
            "requested_by",
            "requested_at",
            "expires_at",
            "decided_by",
            "decided_at",
            "decision_reason",
            "comparison",
            "shadow_report",
            "policy_results",
            "policy_results_at_approval",
        ]

    def get_comparison(self, promotion: PromotionRequest) -> str | None:
        if promotion.version is None:
            return None
        return compare(promotion.version, promotion.base_version, promotion.alias.name).line()


class MoveSerializer(serializers.ModelSerializer[AliasMove]):
    from_version = serializers.IntegerField(source="from_version.version", default=None, allow_null=True)
    to_version = serializers.IntegerField(source="to_version.version")
    moved_by = serializers.CharField(source="moved_by.username", default=None, allow_null=True)
    promotion = serializers.IntegerField(source="promotion_id", default=None, allow_null=True)

    class Meta:
        model = AliasMove
        fields = ["from_version", "to_version", "kind", "reason", "forced", "moved_by", "moved_at", "promotion"]


class AliasSetAnswer(AliasSerializer):
    """The answer to a direct move: the alias, and the move made (null when it already pointed there)."""

    move = MoveSerializer(allow_null=True)

    class Meta(AliasSerializer.Meta):
        fields = [*AliasSerializer.Meta.fields, "move"]


class AliasSetInput(serializers.Serializer[Any]):
    version = serializers.IntegerField(min_value=1)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    force = serializers.BooleanField(required=False, default=False)


class CacheInput(serializers.Serializer[Any]):
    max_bytes = serializers.IntegerField(min_value=promotions.CACHE_MIN_BYTES, max_value=promotions.CACHE_MAX_BYTES)
    ttl_seconds = serializers.IntegerField(min_value=1, max_value=promotions.CACHE_MAX_TTL_SECONDS)


class AliasFlagsInput(serializers.Serializer[Any]):
    protected = serializers.BooleanField(required=False)
    served = serializers.BooleanField(required=False)
    # The promotion policy (null clears a limit): admins only, like the flags.
    max_slowdown_percent = serializers.FloatField(required=False, allow_null=True, min_value=0)
    min_cosine = serializers.FloatField(required=False, allow_null=True, min_value=-1, max_value=1)
    max_abs_diff = serializers.FloatField(required=False, allow_null=True, min_value=0)
    # The signature requirement: admins only. Naming signers (from MODELYARD_TRUSTED_SIGNERS) implies requiring
    # one; an empty list (or one empty form field) is any trusted signer.
    require_signature = serializers.BooleanField(required=False)
    trusted_signers = FormListField(child=serializers.CharField(max_length=150), required=False, max_length=100)
    # The response cache (admins): both bounds turn it on, null turns it off.
    cache = CacheInput(required=False, allow_null=True)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


PROVENANCE_FIELDS = ("require_signature", "trusted_signers")


def _slug(value: str, what: str) -> str:
    import re

    from registry.models import NAME_PATTERN

    if not re.match(NAME_PATTERN, value):
        raise InvalidInput(f"invalid {what} '{value}': use lowercase letters, digits, '.', '_' or '-'")
    return value


def _fleet_laggards(model: str, alias: str, version: int, wait: float, done: str) -> Response | None:
    """Wait until every live inference process serves ``version`` behind the alias; a 504 naming those that do not."""
    behind = serving.fleet_wait(model=model, alias=alias, version=version, timeout=wait)
    if not behind:
        return None
    message = f"{len(behind)} inference worker(s) did not serve version {version} within {wait:g} s; {done}"
    return Response(
        error_body(message, {"laggards": [laggard.as_json() for laggard in behind]}),
        status=status.HTTP_504_GATEWAY_TIMEOUT,
    )


WAIT_PARAMETER = OpenApiParameter("wait", float, description="seconds to wait until every live worker serves it")


def _wait_seconds(request: Request) -> float | None:
    text = request.query_params.get("wait")
    if not text:  # not sent, or sent empty: no waiting
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1
    if not 0 <= seconds <= 600:
        raise InvalidInput(f"'wait' must be a number of seconds between 0 and 600, got {text!r}")
    return seconds


class AliasList(APIView):
    @extend_schema(responses=AliasSerializer(many=True))
    def get(self, request: Request, name: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        return Response(AliasSerializer(selectors.alias_list(model=model), many=True).data)


class AliasClearInput(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class AliasDetail(APIView):
    @extend_schema(responses=AliasSerializer)
    def get(self, request: Request, name: str, alias: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        return Response(AliasSerializer(get_object_or_404(selectors.alias_list(model=model), name=alias)).data)

    @extend_schema(
        request=AliasSetInput, parameters=[WAIT_PARAMETER], responses={200: AliasSetAnswer, 202: PromotionSerializer}
    )
    def put(self, request: Request, name: str, alias: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        data = AliasSetInput(data=request.data)
        data.is_valid(raise_exception=True)
        wait = _wait_seconds(request)
        outcome = promotions.alias_set(
            model=model,
            alias_name=_slug(alias, "alias name"),
            version_number=data.validated_data["version"],
            reason=data.validated_data["reason"],
            force=data.validated_data["force"],
            actor=actor_from_request(request),
        )
        if outcome.promotion is not None:
            return Response(PromotionSerializer(outcome.promotion).data, status=status.HTTP_202_ACCEPTED)
        outcome.alias.refresh_from_db()
        body = AliasSerializer(outcome.alias).data
        # The move this request made; null when the alias already pointed at the version.
        body["move"] = MoveSerializer(outcome.move).data if outcome.move is not None else None
        if wait is not None and outcome.alias.served:
            laggards = _fleet_laggards(name, alias, data.validated_data["version"], wait, "the alias has moved")
            if laggards is not None:
                laggards.data["detail"]["alias"] = body
                return laggards
        return Response(body)

    @extend_schema(request=AliasFlagsInput, responses={200: AliasSerializer, 202: PromotionSerializer})
    def patch(self, request: Request, name: str, alias: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        data = AliasFlagsInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        policy = {name: fields.pop(name) for name in promotions.POLICY_FIELDS if name in fields}
        signature = {name: fields.pop(name) for name in PROVENANCE_FIELDS if name in fields}
        cache = {"cache": fields.pop("cache")} if "cache" in fields else {}
        if policy or signature or cache:
            if "protected" in fields or "served" in fields:
                raise InvalidInput(
                    "send the policy (max_slowdown_percent, min_cosine, max_abs_diff), the signature requirement "
                    "(require_signature, trusted_signers) and the cache without protected or served"
                )
            changed = _set_settings(model, _slug(alias, "alias name"), request, policy, signature, cache)
            return Response(AliasSerializer(changed).data)
        outcome = promotions.alias_update_flags(
            model=model, alias_name=_slug(alias, "alias name"), actor=actor_from_request(request), **fields
        )
        if outcome.promotion is not None:
            return Response(PromotionSerializer(outcome.promotion).data, status=status.HTTP_202_ACCEPTED)
        return Response(AliasSerializer(outcome.alias).data)

    @extend_schema(
        parameters=[OpenApiParameter("reason", str, description="why (recorded); or in a JSON body")],
        responses={200: AliasSerializer},
    )
    def delete(self, request: Request, name: str, alias: str) -> Response:
        """Clear an unprotected alias: it points at nothing (its history stays)."""
        model = get_object_or_404(RegisteredModel, name=name)
        data = AliasClearInput(data=request.data or {"reason": request.query_params.get("reason", "")})
        data.is_valid(raise_exception=True)
        cleared = promotions.alias_clear(
            model=model, alias_name=alias, actor=actor_from_request(request), reason=data.validated_data["reason"]
        )
        return Response(AliasSerializer(cleared).data)


def _set_settings(
    model: RegisteredModel,
    alias: str,
    request: Request,
    policy: dict[str, Any],
    signature: dict[str, Any],
    cache: dict[str, Any],
) -> Alias:
    """The admin's settings of an alias: its signature requirement first, since only it refuses a value it
    was sent (an unknown signer), then its policy, then its response cache; each service checks the admin
    role and audits."""
    actor = actor_from_request(request)
    changed = None
    if signature:
        changed = promotions.alias_set_provenance(model=model, alias_name=alias, actor=actor, **signature)
    if policy:
        changed = promotions.alias_set_policy(model=model, alias_name=alias, actor=actor, changes=policy)
    if cache:
        bounds = cache["cache"] or {}
        changed = promotions.alias_set_cache(
            model=model,
            alias_name=alias,
            actor=actor,
            max_bytes=bounds.get("max_bytes"),
            ttl_seconds=bounds.get("ttl_seconds"),
        )
    assert changed is not None
    return changed


class AliasRollback(APIView):
    # Approvers roll back protected aliases; the service checks the role for each kind of alias.
    permission_classes = [IsAuthenticated]

    @extend_schema(request=ReasonInput, responses=MoveSerializer)
    def post(self, request: Request, name: str, alias: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        data = ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        move = promotions.alias_rollback(
            model=model, alias_name=alias, actor=actor_from_request(request), **data.validated_data
        )
        return Response(MoveSerializer(move).data)


class AliasHistory(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("at", str, description="ISO time: answer which version the alias pointed to")],
        responses=MoveSerializer(many=True),
    )
    def get(self, request: Request, name: str, alias: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        found = get_object_or_404(Alias, model=model, name=alias)
        at_text = request.query_params.get("at")
        if not at_text:  # not sent, or sent empty: the whole history
            return Response(MoveSerializer(selectors.alias_history(alias=found), many=True).data)
        try:
            at = parse_datetime(at_text.replace(" ", "+"))
        except ValueError:  # well-formed but impossible, such as 2026-02-30
            at = None
        if at is None or at.tzinfo is None:
            raise InvalidInput(
                f"'at' must be an ISO 8601 time with a timezone, e.g. 2026-01-31T12:00:00Z; got {at_text!r}"
            )
        try:
            at.astimezone(UTC)  # what the database compares
        except OverflowError:
            text = at_text.replace(" ", "+")
            raise InvalidInput(f"'at' must be a time between 0001-01-01 and 9999-12-31 in UTC; got {text!r}") from None
        move = selectors.alias_move_at(alias=found, at=at)
        return Response(
            {
                "alias": found.name,
                "at": at.isoformat(),
                "version": move.to_version.version if move else None,
                "since": move.moved_at.isoformat() if move else None,
                "move": MoveSerializer(move).data if move else None,
            }
        )


class PromotionList(generics.ListAPIView[PromotionRequest]):
    serializer_class = PromotionSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=PromotionState.values),
            OpenApiParameter("model", str),
            OpenApiParameter("kind", str, enum=PromotionKind.values),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        state = request.query_params.get("state", "")
        if state and state not in PromotionState.values:
            raise InvalidInput(f"unknown state '{state}'; states are {', '.join(PromotionState.values)}")
        kind = request.query_params.get("kind", "")
        if kind and kind not in PromotionKind.values:
            raise InvalidInput(f"unknown kind '{kind}'; kinds are {', '.join(PromotionKind.values)}")
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        params = self.request.query_params
        promotions = selectors.promotion_list(
            state=params.get("state", ""), model_name=params.get("model", ""), kind=params.get("kind", "")
        )
        return promotions.filter(model_scope_q(token_patterns(self.request), "alias__model__name"))


def _promotion_model(kwargs: dict[str, Any]) -> str | None:
    """The model of the promotion a URL names, for the token's model scope (``registry.access.scopes``)."""
    promotions = PromotionRequest.objects.filter(pk=int(kwargs.get("pk", 0)))
    return promotions.values_list("alias__model__name", flat=True).first()


class PromotionDetail(APIView):
    scoped_model = staticmethod(_promotion_model)

    @extend_schema(responses=PromotionSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(PromotionSerializer(get_object_or_404(selectors.promotion_list(), pk=pk)).data)


class _PromotionDecision(APIView):
    # Reviewers hold the approver role, not maintainer; the service checks who may decide.
    permission_classes = [IsAuthenticated]
    service: Any = None
    scoped_model = staticmethod(_promotion_model)

    @extend_schema(request=ReasonInput, responses=PromotionSerializer)
    def post(self, request: Request, pk: int) -> Response:
        data = ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        type(self).service(promotion_id=pk, actor=actor_from_request(request), **data.validated_data)
        return Response(PromotionSerializer(selectors.promotion_list().get(pk=pk)).data)


class PromotionApprove(_PromotionDecision):
    service = staticmethod(promotions.promotion_approve)

    @extend_schema(request=ReasonInput, parameters=[WAIT_PARAMETER], responses=PromotionSerializer)
    def post(self, request: Request, pk: int) -> Response:
        wait = _wait_seconds(request)  # read first: a bad value decides nothing
        response = super().post(request, pk)
        body = response.data
        if wait is not None and body["kind"] == PromotionKind.MOVE:
            alias = Alias.objects.get(model__name=body["model"], name=body["alias"])
            if alias.served:
                done = "the promotion is approved and the alias has moved"
                laggards = _fleet_laggards(body["model"], body["alias"], body["version"], wait, done)
                if laggards is not None:
                    laggards.data["detail"]["promotion"] = body
                    return laggards
        return response


class PromotionReject(_PromotionDecision):
    service = staticmethod(promotions.promotion_reject)


class PromotionCancel(_PromotionDecision):
    service = staticmethod(promotions.promotion_cancel)
