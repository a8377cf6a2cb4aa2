"""Derived versions and benchmarks: thin views over registry.derive.services and registry.benchmarks.services."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, serving
from registry.access.clients import actor_from_request
from registry.api.serializers import FormJSONField
from registry.api.views import _get_version
from registry.benchmarks import services as benchmarks
from registry.derive import services as derivations
from registry.models import DeriveJob, VersionBenchmark


class DeriveJobSerializer(serializers.ModelSerializer[DeriveJob]):
    model = serializers.CharField(source="source.model.name")
    source_version = serializers.IntegerField(source="source.version")
    version = serializers.IntegerField(source="result.version", default=None, allow_null=True)
    requested_by = serializers.CharField(source="requested_by.username", default=None, allow_null=True)

    class Meta:
        model = DeriveJob
        fields = [
            "id",
            "model",
            "source_version",
            "recipe",
            "options",
            "status",
            "error",
            "version",
            "requested_by",
            "created_at",
            "started_at",
            "finished_at",
        ]


class BenchmarkSerializer(serializers.ModelSerializer[VersionBenchmark]):
    version = serializers.IntegerField(source="version.version")

    class Meta:
        model = VersionBenchmark
        fields = [
            "version",
            "provider",
            "host_kind",
            "worker_id",
            "status",
            "numbers",
            "error",
            "note",
            "requested_at",
            "started_at",
            "finished_at",
        ]


class DeriveInput(serializers.Serializer[Any]):
    # Checked by the service, which names the recipes and options it knows.
    recipe = FormJSONField()
    options = FormJSONField(required=False, default=dict)


class VersionDerive(APIView):
    @extend_schema(responses=DeriveJobSerializer(many=True))
    def get(self, request: Request, name: str, version: int) -> Response:
        found = _get_version(name, version)
        return Response(DeriveJobSerializer(selectors.derive_job_list(source=found), many=True).data)

    @extend_schema(request=DeriveInput, responses={202: DeriveJobSerializer})
    def post(self, request: Request, name: str, version: int) -> Response:
        found = _get_version(name, version)
        data = DeriveInput(data=request.data)
        data.is_valid(raise_exception=True)
        job = derivations.derive_request(
            version=found,
            recipe=data.validated_data["recipe"],
            options=data.validated_data["options"],
            actor=actor_from_request(request),
        )
        job.refresh_from_db()  # with an in-process queue it may have started already
        return Response(DeriveJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


def _derive_job_model(kwargs: dict[str, Any]) -> str | None:
    """The model of the derive job a URL names, for the token's model scope (``registry.access.scopes``)."""
    jobs = DeriveJob.objects.filter(pk=int(kwargs.get("pk", 0)))
    return jobs.values_list("source__model__name", flat=True).first()


class DeriveJobDetail(APIView):
    scoped_model = staticmethod(_derive_job_model)

    @extend_schema(responses=DeriveJobSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(DeriveJobSerializer(get_object_or_404(selectors.derive_job_list(), pk=pk)).data)


class VersionBenchmarks(APIView):
    @extend_schema(responses=BenchmarkSerializer(many=True))
    def get(self, request: Request, name: str, version: int) -> Response:
        found = _get_version(name, version)
        return Response(BenchmarkSerializer(selectors.benchmark_list(version=found), many=True).data)

    @extend_schema(request=None, responses={202: BenchmarkSerializer(many=True)})
    def post(self, request: Request, name: str, version: int) -> Response:
        found = _get_version(name, version)
        rows = benchmarks.benchmark_rerun(
            version=found, providers=serving.fleet_providers(), actor=actor_from_request(request)
        )
        return Response(BenchmarkSerializer(rows, many=True).data, status=status.HTTP_202_ACCEPTED)
